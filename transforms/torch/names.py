"""Data tables for the PyTorch analysis: which qualified names mean what.

Kept apart from the logic (as tf_upgrade_v2 keeps its tables apart from its engine) so that
adding an optimizer library or a clipping function is a one-line change.
"""

from __future__ import annotations

import re

#: qualified-name prefixes whose calls build an optimizer
OPTIMIZER_PREFIXES = (
    "torch.optim.",
    "transformers.AdamW",
    "transformers.Adafactor",
    "transformers.optimization.AdamW",
    "transformers.optimization.Adafactor",
    "apex.optimizers.",
    "timm.optim.create_optimizer",
    "timm.optim.",
    "bitsandbytes.optim.",
    "torch_optimizer.",
    "deepspeed.ops.adam.",
)

#: horovod's DistributedOptimizer, as its modules export it: it wraps an optimizer whose gradients
#: it averages asynchronously until step()
HOROVOD_OPTIMIZERS = ("horovod.torch.DistributedOptimizer", "horovod.torch.optimizer.DistributedOptimizer")

#: qualified-name prefixes under OPTIMIZER_PREFIXES that are NOT optimizers
NOT_OPTIMIZER_PREFIXES = (
    "torch.optim.lr_scheduler.",
    "torch.optim.swa_utils.",
    "timm.optim.scheduler",
    "timm.scheduler.",
)

#: a name is optimizer-like when one of its words is one of these ("optimizerD", "opt_g", "g_optim")
_OPTIMIZER_WORDS = {"optimizer", "optimiser", "optim", "opt", "optimizers", "optimisers", "optims"}
_NOT_OPTIMIZER_WORDS = {"sched", "scheduler", "schedulers", "lr", "warmup", "options", "opts"}
_WORD_SPLIT = re.compile(r"_+|(?<=[a-z0-9])(?=[A-Z])")

#: clipping functions that must see unscaled gradients
CLIP_FUNCTIONS = (
    "torch.nn.utils.clip_grad_norm_",
    "torch.nn.utils.clip_grad_norm",
    "torch.nn.utils.clip_grad_value_",
    "torch.nn.utils.clip_grad.clip_grad_norm_",
    "torch.nn.utils.clip_grad.clip_grad_value_",
)
#: attribute spellings of the same functions, for `utils.clip_grad_norm_` reached some other way
CLIP_ATTRIBUTES = ("clip_grad_norm_", "clip_grad_norm", "clip_grad_value_")

#: constructors of a torch.device value (the emitted device is then `<name>.type`)
DEVICE_CONSTRUCTORS = ("torch.device", "torch.accelerator.current_accelerator")

#: model wrappers for data parallel training
PARALLEL_WRAPPERS = (
    "torch.nn.DataParallel",
    "torch.nn.parallel.DataParallel",
    "torch.nn.parallel.DistributedDataParallel",
    "torch.nn.parallel.distributed.DistributedDataParallel",
)

#: FullyShardedDataParallel wrappers: float16 loss scaling then needs ShardedGradScaler (a plain
#: GradScaler does not agree on inf/NaN across ranks) and apex amp does not support them
FSDP_WRAPPERS = (
    "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_sharded_data_parallel.FullyShardedDataParallel",
    "torch.distributed.fsdp.fully_shard",
    "torch.distributed._composable.fsdp.fully_shard",
)

#: FSDP2 as PyTorch >= 2.6 publishes it: its parameters and gradients are DTensors, and DTensor
#: reduces the inf/NaN check of GradScaler.unscale_ over the mesh (PyTorch's own FSDP2 tests use a
#: plain torch.amp.GradScaler), so ranks agree on skipped steps. The private
#: torch.distributed._composable.fsdp spelling is older (2.4, 2.5) and stays refused.
DTENSOR_FSDP_WRAPPERS = ("torch.distributed.fsdp.fully_shard",)
#: FSDP1 (FlatParameter sharding): torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler is
#: its GradScaler (unscale_ all-reduces the inf/NaN check over the process group)
FLAT_PARAMETER_FSDP_WRAPPERS = FSDP_WRAPPERS[:2]
#: RPC training's backward pass (its gradients stay in a distributed autograd context)
DISTRIBUTED_AUTOGRAD_BACKWARD = "torch.distributed.autograd.backward"
#: optimizers that step a distributed autograd context: `opt.step(context_id)` takes no closure
DISTRIBUTED_OPTIMIZERS = (
    "torch.distributed.optim.DistributedOptimizer",
    "torch.distributed.optim.optimizer.DistributedOptimizer",
)
#: the keyword of FullyShardedDataParallel (mixed_precision=) and fully_shard (mp_policy=) that
#: sets FSDP's own mixed precision policy
FSDP_POLICY_KEYWORDS = ("mixed_precision", "mp_policy")

#: binary cross entropy on probabilities: CUDA autocast raises on these
BCE_LOSS_CLASSES = ("torch.nn.BCELoss", "torch.nn.modules.loss.BCELoss")
BCE_FUNCTIONS = ("torch.nn.functional.binary_cross_entropy", "torch.binary_cross_entropy")
SIGMOID_MODULES = ("torch.nn.Sigmoid", "torch.nn.modules.activation.Sigmoid")

#: names with "grad" in them that do not read gradients (no scaler.unscale_ before them)
#: helpers named for a reduction of the gradients across ranks (HER's `sync_grads(network)`
#: through MPI's Allreduce, `average_gradients(model)` through torch.distributed)
_REDUCTION_WORDS = ("sync", "allreduce", "all_reduce", "average_grad", "avg_grad", "average_gradients",
                    "reduce_grad", "mean_grad")


def reduces_gradients(called: str) -> bool:
    """Is `called` (the called name, `sync_grads` or `mpi_utils.sync_grads`) named for a reduction
    of the gradients across ranks?"""
    last = called.rsplit(".", 1)[-1].lower()
    return "grad" in last and any(word in last for word in _REDUCTION_WORDS)


NOT_GRADIENT_HELPERS = {
    "zero_grad", "no_grad", "enable_grad", "set_grad_enabled", "requires_grad_", "requires_grad",
    "set_requires_grad", "backward", "step", "inference_mode",
}

#: constructors of a fresh float32 tensor: an index assignment into one from inside an autocast
#: region (`values[mask] = net(x)`) gets a float16 value and raises (index_put needs equal dtypes)
TENSOR_FACTORIES = {
    "torch.zeros", "torch.ones", "torch.empty", "torch.full", "torch.zeros_like", "torch.ones_like",
    "torch.empty_like", "torch.full_like", "torch.rand", "torch.randn", "torch.tensor", "torch.Tensor",
    "torch.FloatTensor", "torch.cuda.FloatTensor",
}

#: methods/builtins whose result is a Python value, not a tensor: never cast with `.to(dtype)`
PYTHON_VALUE_CALLS = {"item", "tolist", "numpy", "size", "dim", "len", "float", "int", "bool", "str", "sum", "max", "min"}

#: anything under these means the file already trains in mixed precision
MIXED_PRECISION_PREFIXES = (
    "torch.autocast",
    "torch.amp",
    "torch.cuda.amp",
    "torch.cpu.amp",
    "torch.xpu.amp",
    "apex.amp",
    "apex.fp16_utils",
    # FSDP's own mixed precision policies (parameters, reductions and buffers in low precision)
    "torch.distributed.fsdp.MixedPrecision",
    "torch.distributed.fsdp.MixedPrecisionPolicy",
    "torch.distributed.fsdp.fully_sharded_data_parallel.MixedPrecision",
    "torch.distributed.fsdp.api.MixedPrecision",
    "torch.distributed._composable.fsdp.MixedPrecisionPolicy",
    "torch.distributed.fsdp.sharded_grad_scaler",
)
_MIXED_PRECISION_PARENTS = tuple(prefix + "." for prefix in MIXED_PRECISION_PREFIXES)


#: decorators that keep a custom autograd Function in float32 under autocast
#: (autograd_functions_float32.py writes them): no use of mixed precision by the training code
FUNCTION_PRECISION_DECORATORS = frozenset(
    f"{module}.{name}" for module in ("torch.amp", "torch.cuda.amp", "torch.amp.autocast_mode", "torch.cuda.amp.autocast_mode")
    for name in ("custom_fwd", "custom_bwd"))


def is_mixed_precision(qualified: str) -> bool:
    """Is this qualified name one of MIXED_PRECISION_PREFIXES or under one (the decorators that keep
    a custom autograd Function in float32 aside)?"""
    return (qualified in MIXED_PRECISION_PREFIXES or qualified.startswith(_MIXED_PRECISION_PARENTS)) \
        and qualified not in FUNCTION_PRECISION_DECORATORS

#: frameworks that own the training loop and their own mixed precision switch
LOOP_OWNING_FRAMEWORKS = {
    "accelerate": "Hugging Face Accelerate manages mixed precision: use Accelerator(mixed_precision='fp16'/'bf16')",
    "pytorch_lightning": "Lightning manages mixed precision: use Trainer(precision='16-mixed'/'bf16-mixed')",
    "lightning": "Lightning manages mixed precision: use Trainer(precision='16-mixed'/'bf16-mixed')",
    "deepspeed": "DeepSpeed manages mixed precision: enable \"fp16\"/\"bf16\" in the DeepSpeed config",
}

#: calls that only move or build input data; a statement with nothing but these is not "forward"
DATA_PREPARATION_CALLS = {
    "to", "cuda", "cpu", "next", "iter", "__iter__", "__next__", "len", "enumerate", "size", "fill_", "zero_",
    "item", "DataLoader",
    "float", "long", "int", "view", "reshape", "unsqueeze", "squeeze", "permute", "contiguous",
    "detach", "clone", "range", "zip", "full", "full_like", "zeros", "zeros_like", "ones",
    "ones_like", "randn", "randn_like", "rand", "rand_like", "randint", "empty", "arange",
    "tensor", "as_tensor", "from_numpy", "Variable", "zero_grad", "train", "eval", "print",
    "isinstance", "type", "get", "items", "keys", "values", "append", "time", "perf_counter",
    "update", "format", "str", "dict", "list", "tuple", "split", "chunk", "cat", "stack",
    # Python's own arithmetic on sizes and counters (`max_mem = min(self.mem_cntr, self.mem_size)`)
    "min", "max", "abs", "round",
    # legacy tensor constructors (also the usual aliases, `Tensor = torch.cuda.FloatTensor if cuda
    # else torch.FloatTensor`) and numpy's random draws: `valid = Variable(Tensor(n, 1).fill_(1.0))`
    "FloatTensor", "LongTensor", "DoubleTensor", "HalfTensor", "ByteTensor", "BoolTensor", "IntTensor", "Tensor",
    "normal", "uniform", "choice", "permutation", "randperm", "linspace", "eye", "bernoulli",
    "new_zeros", "new_ones", "new_full", "new_empty", "new_tensor", "empty_like",
    # a batch copied into a preallocated buffer: `real_A = Variable(input_A.copy_(batch['A']))`
    "copy_",
    # lists of rewards and returns built before a policy-gradient loss
    "appendleft", "insert", "extend", "extendleft", "deque",
}

#: modules whose functions compute on host data, never a model's forward pass
HOST_DATA_MODULES = ("numpy", "math", "random")
#: torch's data loading (`iter(data.DataLoader(dataset, ...))` re-made at each epoch boundary of an
#: iteration-counted loop, Retinaface's and ssd.pytorch's): builds batches, runs no model
DATA_LOADING_PREFIX = "torch.utils.data."

#: methods that fetch a batch when called on a data source (`replay_buffer.sample(batch_size)`,
#: `train_dataset.get_batch()`, `data_iter.next()`): data preparation, not a forward pass. Only
#: with a receiver named like a data source (DATA_SOURCE_WORDS): `generator.sample(z)` runs a model
DATA_SOURCE_METHODS = {"sample", "get_batch", "next_batch", "get_next", "load_batch", "next", "__next__",
                       "sample_batch", "sample_buffer"}
DATA_SOURCE_WORDS = ("buffer", "memory", "replay", "dataset", "loader", "data", "iter", "batch", "queue", "storage",
                     "rollout", "sampler", "mem")
#: receivers named exactly so are data sources too (cleanrl's replay buffer `rb.sample(n)`)
DATA_SOURCE_NAMES = {"rb", "rbuf", "per"}

#: tensor methods and builtins that compute on tensors already made: a region whose calls are
#: all of these (or of imported functions such as torch.cat) holds no model forward pass
TENSOR_ARITHMETIC_CALLS = DATA_PREPARATION_CALLS | {
    "sum", "mean", "cat", "stack", "log", "exp", "pow", "mul", "add", "sub", "div", "neg", "abs",
    "norm", "max", "min", "clamp", "gather", "masked_select", "log_softmax", "softmax", "sqrt",
    "insert", "extend", "sort", "reversed", "sorted", "round", "sign", "prod", "std", "var",
    # shape and elementwise tensor methods: `rewards.t()`, `probs.flatten()` run no model
    "t", "transpose", "flatten", "expand", "expand_as", "repeat", "type_as", "tolist", "numpy",
    "sigmoid", "tanh", "relu", "square", "reciprocal", "log1p", "floor", "ceil", "argmax", "argmin",
    "topk", "index_select", "narrow", "select", "unbind", "clamp_min", "clamp_max", "sum_to_size",
}

#: the ops CUDA autocast runs in float16 (PyTorch's autocast op reference, "CUDA Ops that can
#: autocast to float16"), by function or method name: code that calls none of them (and no model)
#: gains nothing under autocast
AUTOCAST_LOWER_PRECISION_OPS = frozenset({
    "matmul", "mm", "bmm", "mv", "addmm", "addbmm", "baddbmm", "addmv", "addr", "chain_matmul",
    "multi_dot", "linear", "bilinear", "einsum", "prelu", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d", "conv_transpose3d", "convolution", "_convolution",
    "cudnn_convolution", "cudnn_convolution_transpose", "lstm_cell", "gru_cell", "rnn_tanh_cell",
    "rnn_relu_cell", "scaled_dot_product_attention", "multi_head_attention_forward", "__matmul__",
})

#: dtypes whose finfo limits overflow float16 (`torch.finfo(torch.float32).min` as a mask value)
WIDE_FLOAT_DTYPES = {"float32", "float", "float64", "double", "single"}

#: reduced-precision dtypes: casting a model or its inputs to these by hand is manual half precision
HALF_DTYPES = {"torch.float16", "torch.half", "torch.bfloat16"}

#: the largest finite float16 value; masked_fill with a bigger constant overflows
FLOAT16_MAX = 65504.0


def is_optimizer_qualname(qualified: str) -> bool:
    """Does a call to `qualified` build an optimizer (and not a scheduler)?"""
    if any(qualified.startswith(p) for p in NOT_OPTIMIZER_PREFIXES):
        return False
    if "lr_scheduler" in qualified or "scheduler" in qualified.lower():
        return False
    return any(qualified == p or qualified.startswith(p) for p in OPTIMIZER_PREFIXES)


def looks_like_optimizer_name(dotted: str) -> bool:
    """`optimizerD`, `opt_g`, `self.g_optim` yes; `scheduler`, `opt` args, `env` no."""
    last = dotted.rsplit(".", 1)[-1]
    words = {w.lower() for w in _WORD_SPLIT.split(last) if w}
    if words & _NOT_OPTIMIZER_WORDS:
        return False
    if words & _OPTIMIZER_WORDS:
        return True
    lowered = last.lower()
    return ("optimizer" in lowered or "optimiser" in lowered or lowered.startswith("optim")) and (
        "sched" not in lowered
    )


_DEVICE_WORDS = re.compile(r"device|gpu|cuda|rank|^dev$", re.IGNORECASE)


def looks_like_device_name(dotted: str) -> bool:
    """`device`, `args.device`, `self.gpu_id`, `local_rank` yes; `dtype`, `x` no."""
    return bool(_DEVICE_WORDS.search(dotted.rsplit(".", 1)[-1]))


#: torch.optim's optimizer classes, as a driver calls them (`optim.SGD(...)`): a file that builds one
#: and hands it to a training function of another module is screened in (see driver.py)
TORCH_OPTIMIZER_CLASS_NAMES = frozenset({
    "SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "ASGD", "LBFGS", "NAdam",
    "RAdam", "SparseAdam", "Adafactor", "Muon",
})
