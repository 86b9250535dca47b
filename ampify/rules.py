"""The rule catalogue: every code ampify can emit, in one place.

Each rule says what it means, for which target, how serious it is, why it matters, what the code
looks like before and after, and whether ampify's fix is safe to apply unreviewed. From it come
`ampify rules`, `ampify rule CODE`, the README's rule table (a test keeps the two identical),
`--select` / `--ignore`, and which warnings leave a conversion "changed, incomplete".

Code policy (as TorchFix's README states its own): `AMP0xx` the engine (files, I/O), `AMP1xx` the
TF1 graph rewrite, `AMP2xx` PyTorch native AMP, `AMP3xx` apex, `AMP4xx` migrations, `AMP5xx` Keras,
`AMP6xx` MXNet Gluon. Within a target `x0x` are changes
made (info), `x1x` and up are patterns left alone or unsafe (warnings), `x00` an internal error.
A code keeps its meaning once released; a code split in two keeps the old number for the first
meaning and the change is listed in CHANGELOG.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, List, Optional, Sequence

#: how far ampify's own fix for a rule can be trusted without review
SAFE = "safe"  # ampify rewrote it; the rewrite is exact
REVIEW = "review"  # ampify rewrote it; read the diff (placement, device, a moved statement)
MANUAL = "manual"  # ampify did not change it: the finding says what to do by hand

TARGETS = {
    "AMP0": "engine",
    "AMP1": "tf1",
    "AMP2": "torch-native",
    "AMP3": "torch-apex",
    "AMP4": "torch-migrate",
    "AMP5": "keras",
    "AMP6": "gluon",
}


@dataclass(frozen=True)
class Rule:
    code: str
    severity: str  # "info", "warning", "error", or "info or warning"
    summary: str  # one line, as in the README table (Markdown)
    why: str
    example: str
    fix: str
    #: on a changed file, a warning of this code means part of the training stays float32 or unscaled
    incomplete: bool = False

    @property
    def target(self) -> str:
        return TARGETS[self.code[:4]]


#: the example of both backends' RPC rules (AMP234, AMP326)
_RPC_EXAMPLE = (
    "with dist_autograd.context() as context_id:\n    dist_autograd.backward(context_id, [loss])\n    opt.step(context_id)"
)

RULES: List[Rule] = [
    Rule("AMP001", "error", "error: the converted file could not be written (read-only, changed or vanished during the run)",
         "A file is either untouched or replaced whole: when the write cannot happen safely, nothing is written.",
         "train.py: failed: file changed on disk during the run, not overwritten", MANUAL),
    Rule("AMP002", "info", "PyTorch 0.3's `.cuda(async=True)` / `.to(..., async=True)` is now `non_blocking=True`",
         "`async` is a keyword since Python 3.7, so the file runs on no Python with a current PyTorch; PyTorch 0.4 "
         "renamed the argument `non_blocking`, the same transfer. Renamed only in `.cuda()` / `.to()` calls, and only "
         "in a file ampify converts; any other outdated syntax still leaves the file untouched, with the reason.",
         "target = target.cuda(async=True)\n  -> target = target.cuda(non_blocking=True)", REVIEW),
    Rule("AMP100", "error", "error: internal error in the TF1 transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP100 internal error in the tf1-graph-rewrite transform (KeyError: ...); this file is left unchanged", MANUAL),
    Rule("AMP101", "info", "TF1 optimizer wrapped with `enable_mixed_precision_graph_rewrite`",
         "The graph rewrite casts allowlisted ops to float16 and adds dynamic loss scaling, but only for graphs "
         "built with a wrapped optimizer.",
         "opt = tf.train.AdamOptimizer(1e-3)\n  -> opt = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite("
         "tf.train.AdamOptimizer(1e-3))", SAFE),
    Rule("AMP102", "info", "`TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE=1` set before TensorFlow is imported",
         "Without it GPUs older than Volta silently skip the rewrite: the field report's 'no memory saved' case.",
         'import tensorflow as tf\n  -> import os\n     os.environ.setdefault("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE", "1")\n'
         "     import tensorflow as tf", SAFE),
    Rule("AMP103", "info", "`tf.gradients` feeding `apply_gradients` rewritten to the optimizer's `compute_gradients` (loss-scaled)",
         "Only the wrapped optimizer's compute_gradients scales the loss; tf.gradients results underflow in float16.",
         "grads = tf.gradients(loss, tvars)\n  -> grads = [g for g, _ in opt.compute_gradients(loss, var_list=tvars)]", REVIEW),
    Rule("AMP104", "info", "NGC-only `TF_ENABLE_AUTO_MIXED_PRECISION=1` removed; the optimizers are wrapped with the graph rewrite instead",
         "Only NVIDIA's NGC builds of TensorFlow 1.x read the switch: upstream TensorFlow trains such a script in float32. "
         "The wrapper works in both builds; removing the switch keeps an NGC run from getting two loss scales.",
         'os.environ["TF_ENABLE_AUTO_MIXED_PRECISION"] = "1"\nopt = tf.train.AdamOptimizer(1e-3)\n'
         "  -> opt = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer(1e-3))", REVIEW),
    Rule("AMP105", "info", "a Session created before the optimizer (here, or by a caller in another module) gets the rewrite through its config",
         "TensorFlow turns the rewrite on only for Sessions created after the wrapper; a Session created earlier (in this "
         "file, or by the caller: both files, one change set) gets `auto_mixed_precision` set in its ConfigProto instead, "
         "bound to a new variable when the config is written inline or absent.",
         "with tf.Session(config=run_config) as sess:  # main.py\n  -> run_config.graph_options.rewrite_options"
         ".auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON", REVIEW),
    Rule("AMP106", "info", "Sigmoid kept in float32: the loss takes the log of a sigmoid's probability (`tf.log(1 - D_fake + 1e-8)`)",
         "The rewrite runs `tf.nn.sigmoid` in float16 after an allowed MatMul (its infer list): a confident "
         "discriminator's probability rounds to 1, `1 - D_fake + 1e-8` is 0, the log -inf, and the loss-scale "
         "optimizer skips every step. Taking Sigmoid off the infer list (TF >= 2.4: INFERLIST, TF 1.14-2.3: GRAYLIST) "
         "keeps every Sigmoid of the graph in float32; the rest still converts.",
         'import tensorflow as tf\n  -> os.environ.setdefault("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_REMOVE", "Sigmoid")\n'
         '     os.environ.setdefault("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_GRAYLIST_REMOVE", "Sigmoid")\n     import tensorflow as tf',
         SAFE),
    Rule("AMP107", "info", "matrix products kept in float32: the graph computes a Gram matrix (`tf.matmul(feats_T, feats)`, style transfer)",
         "A Gram matrix sums height*width products of feature maps: the rewrite runs MatMul / BatchMatMul in float16 "
         "(its allow list), the sum passes 65504 before the division by the size, the style loss is inf, and the "
         "loss-scale optimizer skips every step, silently. Taking the matrix products off the allow list (TF >= 2.4: "
         "ALLOWLIST, TF 1.14-2.3: WHITELIST) keeps them float32; the convolutions still convert.",
         'import tensorflow as tf\n  -> os.environ.setdefault("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", '
         '"MatMul,BatchMatMul,BatchMatMulV2,BatchMatMulV3,Einsum")\n     import tensorflow as tf', SAFE),
    Rule("AMP110", "warning", "`tf.gradients` reaches `apply_gradients` in a form that cannot be rewritten safely, or is handed to other code with the optimizer",
         "Gradients that bypass the wrapper's compute_gradients are never loss-scaled: float16 gradients underflow silently.",
         "variable_mgr.append_apply_gradients_ops(state, opt, tf.gradients(loss, params), ops)", MANUAL, incomplete=True),
    Rule("AMP111", "warning", "optimizer built in a loop or comprehension (one loss scale each)",
         "Each wrapped optimizer keeps its own dynamic loss scale; that still trains, but the scales drift apart.",
         "opts = [tf.train.AdamOptimizer(lr) for lr in rates]", MANUAL),
    Rule("AMP112", "warning", "Keras optimizer in TF1 code: the graph rewrite refuses it, not wrapped",
         "enable_mixed_precision_graph_rewrite raises on Keras optimizers; use a Keras mixed precision policy instead.",
         "opt = tf.keras.optimizers.Adam(1e-3)", MANUAL, incomplete=True),
    Rule("AMP128", "warning", "the file also trains on TPUs (CrossShardOptimizer, TPUEstimator): the graph rewrite converts GPU graphs only",
         "TPU runs keep their float32 graph, wrapped in a loss scale that does nothing there: the TPU's mixed "
         "precision is bfloat16 (tf.contrib.tpu.bfloat16_scope), which ampify does not write. GPU runs of the "
         "same code (use_tpu=False) are converted.",
         "if use_tpu:\n    opt = tf.contrib.tpu.CrossShardOptimizer(opt)", MANUAL, incomplete=True),
    Rule("AMP113", "warning", "a Session is created before the rewrite is enabled: that Session never gets it",
         "TensorFlow turns the rewrite on only for Sessions created after enable_mixed_precision_graph_rewrite: "
         "nothing runs in float16.",
         "sess = tf.Session()\nopt = tf.train.AdamOptimizer(1e-3)  # wrapped too late for sess", MANUAL, incomplete=True),
    Rule("AMP114", "warning", "unwrapped TF1 optimizer in a file that already uses mixed precision",
         "Its loss is not scaled while the rest of the file trains in float16.",
         "opt_d = enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer())\nopt_g = tf.train.AdamOptimizer()", MANUAL),
    Rule("AMP115", "warning", "`apply_gradients` gets gradients that cannot be traced to `compute_gradients` / `tf.gradients`, or that another optimizer computed",
         "Gradients from elsewhere (a tape, another optimizer with its own loss scale) are not scaled by this wrapper.",
         "grads = local_opt.compute_gradients(loss)\nglobal_opt.apply_gradients(grads)", MANUAL, incomplete=True),
    Rule("AMP116", "warning", "optimizer class from another module: wrap it where that module builds it, or by hand",
         "ampify reads one file at a time: an optimizer built elsewhere cannot be wrapped here.",
         "opt = optimization.create_optimizer(loss, lr, steps)", MANUAL, incomplete=True),
    Rule("AMP117", "warning", "optimizer built inside TensorFlow (`optimize_loss` given an unknown name or no learning rate, canned Estimators given a name)",
         "TensorFlow builds the optimizer itself, so there is nothing in the script to wrap (an optimize_loss "
         "given one of its own names is spelled out and wrapped: AMP126).",
         'tf.contrib.layers.optimize_loss(loss, step, lr, optimizer="Adam")', MANUAL, incomplete=True),
    Rule("AMP118", "warning", "optimizer class handed to code outside this file, or named by a string",
         "The class is instantiated elsewhere (or looked up by name), where ampify cannot wrap it.",
         'build(optimizer_class=tf.train.AdamOptimizer)  /  tf_optimizer="tf.train.AdamOptimizer"', MANUAL, incomplete=True),
    Rule("AMP119", "warning", "TF1 optimizer not wrapped: the code reads an attribute the wrapper does not forward (e.g. `opt._lr`)",
         "The wrapper does not forward private attributes: wrapping would make the script fail.",
         "opt = tf.train.MomentumOptimizer(lr, 0.9)\nprint(opt._learning_rate)", MANUAL, incomplete=True),
    Rule("AMP120", "warning", "eager execution turned on (`tf.enable_eager_execution()`) and nothing builds a graph (no `tf.function`, Session, `tf.Graph`, Estimator): the rewrite changes graphs only, so the ops stay float32",
         "The graph rewrite never sees eager ops: a measured run converted 0 nodes eagerly, 30 inside tf.function.",
         "tf.enable_eager_execution()\nopt = tf.train.AdamOptimizer()", MANUAL, incomplete=True),
    Rule("AMP121", "info", "`tf` bound only by a star import (`from ops import *`) and used as TF1 (`tf.train.*Optimizer`): taken as TensorFlow, `import tensorflow` added above the star import",
         "Without an import of its own the file looked like no TensorFlow code at all, and stayed float32 silently.",
         "from ops import *\n  -> import tensorflow\n     from ops import *", REVIEW),
    Rule("AMP122", "warning", "NGC-only `TF_ENABLE_AUTO_MIXED_PRECISION` set conditionally, or with no optimizer here to wrap: upstream TensorFlow ignores it",
         "Outside NVIDIA's NGC containers the script trains in float32 while its author believes it is mixed precision; "
         "ampify cannot tell from a flag when mixed precision is meant, so the file is left as it is.",
         "os.environ['TF_ENABLE_AUTO_MIXED_PRECISION'] = '1' if args.amp else '0'", MANUAL),
    Rule("AMP123", "warning", "the optimizer is built by a function of another module that is not in this run; not converted",
         "The file trains through a project helper that builds the optimizer (BERT's `optimization.create_optimizer`): the "
         "mixed precision wrapper goes into that module, and this file needs no change. Named together (or with the "
         "repository), the helper's module is converted and this file reports nothing to do.",
         "train_op = optimization.create_optimizer(loss, lr, steps, warmup)  # in run_classifier.py", MANUAL, incomplete=True),
    Rule("AMP124", "warning", "parameter gradients from tf.gradients (here, or from a helper of another module) are used without an optimizer; not converted",
         "Under the graph rewrite only the wrapped optimizer scales the loss: gradients with respect to variables that "
         "the file uses by hand (`tf.assign_sub(w, lr * g)`, a TRPO or natural-gradient step; spinningup's "
         "`core.flat_grad(pi_loss, pi_params)`) are float16 and unscaled, and can underflow silently. Gradients the "
         "file applies with apply_gradients, adds to a loss it minimizes (a gradient penalty), returns to a caller, or "
         "takes with respect to inputs (a saliency map) are not flagged.",
         "gradient = core.flat_grad(pi_loss, pi_params)\ng = sess.run(gradient, feed_dict=inputs)", MANUAL,
         incomplete=True),
    Rule("AMP125", "warning", "the training graph is built under `tf.device('/cpu:0')` and nothing in the file is placed on a GPU: the rewrite converts GPU ops only, so the ops stay float32",
         "TensorFlow's auto_mixed_precision pass processes only nodes placed on a GPU (IsOnGPU in "
         "auto_mixed_precision.cc; the rest are skipped as \"not on the GPU\"). A3C implementations build their whole "
         "graph under a CPU device scope for their thread workers: the optimizer is wrapped and its loss scaled, "
         "and nothing runs in float16.",
         "with tf.device('/cpu:0'):\n    trainer = tf.train.AdamOptimizer(1e-4)\n    master_network = AC_Network(...)",
         MANUAL, incomplete=True),
    Rule("AMP126", "info", "`optimize_loss(..., optimizer=\"Adam\")` (or a class) spelled as `lambda lr: tf.train.AdamOptimizer(learning_rate=lr)` and wrapped",
         "optimize_loss builds the optimizer a string names from its learning-rate tensor (after any decay "
         "function) and calls a callable the same way, so the callable builds the same optimizer, in the file, "
         "where the graph rewrite wraps it; optimize_loss then computes unscaled gradients with the wrapper "
         "(its clipping and summaries see true values) and applies them through it.",
         'train_op = tf.contrib.layers.optimize_loss(loss, step, lr, optimizer="Adam")', SAFE),
    Rule("AMP127", "warning", "a `tf.train.Saver` checkpoint written before the conversion does not restore into the converted graph",
         "The wrapped optimizer adds the loss scale's variables (current_loss_scale, good_steps) and moves Adam's beta "
         "powers under a cond scope, so `saver.restore(sess, old_checkpoint)` raises NotFoundError; the converted "
         "script's own checkpoints restore. Said where the file restores a Saver checkpoint; the conversion is whole.",
         "saver = tf.train.Saver()\nsaver.restore(sess, ckpt)  # written by the float32 script", MANUAL),
    Rule("AMP200", "error", "error: internal error in the PyTorch native transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP200 internal error in the torch-native-amp transform (RecursionError: ...); this file is left unchanged", MANUAL),
    Rule("AMP201", "info", "`torch.autocast` added around the forward pass and loss",
         "autocast runs matmuls and convolutions in float16/bfloat16 and keeps precision-sensitive ops in float32. "
         "When the loss is built from model outputs kept in a list that another function of the file fills "
         "(REINFORCE's `policy.saved_log_probs.append(...)` in select_action()), the forward pass there gets its own "
         "autocast block.",
         "loss = criterion(model(x), y)\n  -> with torch.autocast(device_type=device.type, dtype=torch.float16):\n"
         "         loss = criterion(model(x), y)", SAFE),
    Rule("AMP202", "info", "`backward()` scaled through the GradScaler",
         "Scaling the loss keeps small float16 gradients from underflowing to zero.",
         "loss.backward()\n  -> scaler.scale(loss).backward()", SAFE),
    Rule("AMP203", "info", "`optimizer.step()` through the GradScaler, one `scaler.update()` per iteration",
         "scaler.step unscales the gradients and skips steps with inf/NaN; update adapts the scale.",
         "optimizer.step()\n  -> scaler.step(optimizer)\n     scaler.update()", SAFE),
    Rule("AMP204", "info", "GradScaler created (or passed in as a new parameter)",
         "One scaler per training run, created once the optimizers exist, reachable where they step.",
         'optimizer = torch.optim.SGD(...)\n  -> scaler = torch.amp.GradScaler(device.type)', REVIEW),
    Rule("AMP205", "info", "`scaler.unscale_(optimizer)` before gradient clipping",
         "Clipping or reading .grad needs true gradients, not scaled ones.",
         "clip_grad_norm_(model.parameters(), 1.0)\n  -> scaler.unscale_(optimizer)\n     clip_grad_norm_(model.parameters(), 1.0)", SAFE),
    Rule("AMP206", "info", "GradScaler state saved/loaded with the optimizer's checkpoint state",
         "Without its state a resumed run restarts the loss scale at 65536 and skips steps until it settles.",
         '"optimizer": optimizer.state_dict()\n  -> ..., "scaler": scaler.state_dict()', REVIEW),
    Rule("AMP207", "info", "device `\"cuda\"` taken from the script's `.cuda()` calls (no device variable found)",
         "autocast and the GradScaler need the device the script trains on; `.cuda()` calls name it.",
         'model.cuda()\n  -> with torch.autocast(device_type="cuda", dtype=torch.float16): ...', REVIEW),
    Rule("AMP208", "info", "GradScaler threaded across files: the step's function takes it, its caller in another module creates and passes it",
         "The scaler must live where the optimizer is created (once per run) and reach the step that uses it; both files are written as one change set.",
         "def train_one_epoch(model, loader, optimizer, device):  # engine.py\n  -> def train_one_epoch(model, loader, optimizer, device, scaler):\n"
         "train_one_epoch(model, loader, optimizer, device)  # main.py\n  -> scaler = torch.amp.GradScaler(device.type)\n"
         "     train_one_epoch(model, loader, optimizer, device, scaler=scaler)", REVIEW),
    Rule("AMP209", "info", "a framework owns the training loop: its own mixed precision switch set (Accelerate, Lightning, Hugging Face Trainer)",
         "The framework autocasts and scales its own loop; setting its switch is the whole conversion. A switch the script already sets is kept.",
         'accelerator = Accelerator()\n  -> accelerator = Accelerator(mixed_precision="fp16")', SAFE),
    Rule("AMP210", "warning", "`BCELoss` / `binary_cross_entropy` under autocast",
         "CUDA autocast raises on BCELoss: use BCEWithLogitsLoss on logits.",
         "criterion = nn.BCELoss()", MANUAL),
    Rule("AMP211", "warning", "`optimizer.step(closure)`: GradScaler does not support closures",
         "GradScaler.step cannot re-run a closure with a scaled loss (LBFGS and the like).",
         "optimizer.step(closure)", MANUAL, incomplete=True),
    Rule("AMP212", "warning", "`torch.autograd.grad` in a training step (gradient penalty, MAML inner loop, adversarial examples) needs manual loss scaling",
         "A gradient penalty computed from unscaled outputs underflows; PyTorch's AMP examples scale it by hand. So do "
         "the plain `torch.autograd.grad(loss, params)` of a MAML inner loop and the input gradients of FGSM/PGD "
         "examples computed in the step: ampify scales them when the gradients are assigned, and refuses otherwise.",
         "grads = torch.autograd.grad(out, inputs, create_graph=True)", MANUAL, incomplete=True),
    Rule("AMP213", "warning", "`masked_fill` with a constant that overflows float16",
         "-1e9 is -inf in float16: attention masks then produce NaN.",
         "scores.masked_fill(mask, -1e9)", MANUAL),
    Rule("AMP214", "warning", "optimizer wrapper class with its own `step()`",
         "The real optimizer hides inside the wrapper (ScheduledOptim): the scaler must step that one.",
         "class ScheduledOptim:\n    def step(self): self._optimizer.step()", MANUAL),
    Rule("AMP215", "warning", "training step refused: its structure cannot be followed in this file (the reason follows); left unconverted",
         "When ampify cannot be sure, it refuses with the true reason instead of writing a wrong conversion.",
         "engine.train_one_epoch(model, criterion, loader, optimizer)  # the step is in another module", MANUAL, incomplete=True),
    Rule("AMP216", "warning", 'device: `"cuda"` assumed, or used for both autocast and the GradScaler because the step cannot see the script\'s device',
         "autocast and GradScaler switch themselves off on a device they do not name; both must name the same one.",
         'with torch.autocast(device_type="cuda", ...)', REVIEW, incomplete=False),
    Rule("AMP228", "warning", "the script never moves the model or the data to a device: it trains on the CPU, where CUDA autocast and GradScaler do nothing",
         "autocast(\"cuda\") and GradScaler(\"cuda\") switch themselves off for CPU tensors: every op stays float32 until "
         "the model and the batches are moved to the GPU.", "model = Net()  # never .cuda() / .to(device)", MANUAL,
         incomplete=True),
    Rule("AMP217", "warning", "hand-made half precision (`.half()`, `.to(torch.float16)`)",
         "A model already in float16 gets float16 gradients, which GradScaler refuses.",
         "model = model.half()", MANUAL),
    Rule("AMP218", "warning", "the file uses mixed precision, but not around this training step: nothing converted",
         "autocast only in an evaluation function, say: the training step still runs in float32.",
         "with torch.autocast('cuda'):\n    evaluate(model)\n...\nloss.backward()  # float32", MANUAL, incomplete=True),
    Rule("AMP219", "warning", "an optimizer step with no `backward()` in this file: the backward pass runs elsewhere",
         "The step must go through the scaler that scaled the backward, which this file cannot see.",
         "engine.backward_pass(loss)\noptimizer.step()", MANUAL, incomplete=True),
    Rule("AMP220", "warning", "`backward()` with no optimizer step that can be identified; not converted",
         "GradScaler needs the optimizer the gradients go to (a wrapped or hidden optimizer?).",
         "loss.backward()  # stepped elsewhere", MANUAL, incomplete=True),
    Rule("AMP221", "warning", "the file trains but never imports torch by name; not converted",
         "Without `import torch` ampify cannot spell torch.autocast / torch.amp.GradScaler for this file.",
         "from model import *\nloss.backward()\noptimizer.step()", MANUAL, incomplete=True),
    Rule("AMP222", "warning", "FullyShardedDataParallel with float16 where ampify cannot create a ShardedGradScaler; not converted",
         "FSDP needs ShardedGradScaler (ranks must agree on skipped steps). In a file that wraps the model in "
         "FullyShardedDataParallel and steps it, ampify creates one (AMP236); refused when the scaler would be created "
         "in another module, or for the private torch.distributed._composable.fsdp.fully_shard; or use bfloat16. "
         "torch.distributed.fsdp.fully_shard (PyTorch >= 2.6) is converted with a plain GradScaler: its DTensor "
         "gradients make GradScaler's inf check agree over the mesh.",
         "model = FSDP(model)", MANUAL, incomplete=True),
    Rule("AMP223", "warning", "`torch.autograd.backward(...)` not converted",
         "Only `loss.backward()` is rewritten to scaler.scale(loss).backward().",
         "torch.autograd.backward(losses)", MANUAL, incomplete=True),
    Rule("AMP224", "warning", "checkpoint form not extended: save/load the GradScaler's state by hand",
         "A resumed run would restart the loss scale at 65536 and skip steps until it settles.",
         'torch.save(optimizer.state_dict(), path)  # a form ampify does not extend', MANUAL),
    Rule("AMP225", "warning", "framework constructor called with `**kwargs`: its precision switch may be set there; not changed",
         "ampify cannot see inside **kwargs; setting the switch beside them could clash with a value passed in.",
         "trainer = Trainer(**config)", MANUAL, incomplete=True),
    Rule("AMP226", "warning", "parameters updated by hand (no optimizer) with float16: GradScaler cannot be used; not converted",
         "GradScaler unscales and steps an optimizer; a hand-written update has none. bfloat16 needs no loss scaling.",
         "loss.backward()\nfor p in model.parameters():\n    p.data.add_(p.grad, alpha=-lr)", MANUAL, incomplete=True),
    Rule("AMP227", "warning", "Opacus (DP-SGD) training: per-sample gradients that GradScaler would scale; file not converted",
         "Opacus's optimizer clips and noises per-sample gradients; scaled gradients would change the clipping bound and "
         "the privacy accounting.", "model, optimizer, loader = privacy_engine.make_private(...)", MANUAL, incomplete=True),
    Rule("AMP234", "warning", "RPC training (`torch.distributed.autograd.backward` + DistributedOptimizer): GradScaler and autocast cannot reach it; file not converted",
         "The gradients live in a distributed autograd context that a DistributedOptimizer steps, with no local .grad to "
         "unscale; the forward pass runs partly on remote workers, where a local autocast does not apply.",
         _RPC_EXAMPLE, MANUAL, incomplete=True),
    Rule("AMP237", "warning", "the training step this file runs (with its optimizer, or wholly) is in a module not in this run; not converted",
         "A driver (DETR's main.py) builds the optimizer and hands it to `engine.train_one_epoch(...)`: the GradScaler is "
         "created in the driver and passed to the step in the engine, one change set for both files. Named alone, the "
         "driver was reported as having no training code while it trains in float32.",
         "train_one_epoch(model, criterion, loader, optimizer, device)  # engine.py not named", MANUAL, incomplete=True),
    Rule("AMP238", "warning", "a Gram matrix (`torch.mm(f, f.t())`) overflows float16 under autocast; file not converted",
         "Style transfer's Gram matrices sum h*w products of feature maps: beyond 65504 the loss is inf and GradScaler "
         "skips every step, silently. bfloat16 has the range: --dtype bfloat16 converts.",
         "G = torch.mm(f, f.t())", MANUAL, incomplete=True),
    Rule("AMP239", "warning", "an optimizer handed through code ampify does not follow (`Optimizer(torch.optim.Adam(...))`, `wrap(optimizer)`); its steps left unconverted",
         "`scaler.step(wrapper)` fails on an object with no param_groups, skips what the wrapper's step() does, or "
         "races horovod's allreduce; a wrapper class of the project is converted through (AMP233), other code is not.",
         "optimizer = Optimizer(torch.optim.Adam(model.parameters()), max_grad_norm=5)  # from seq2seq.optim", MANUAL,
         incomplete=True),
    Rule("AMP240", "warning", "horovod's `DistributedOptimizer` wraps the optimizer on some paths only (or a parameter that may be it): its steps left unconverted",
         "Horovod averages the gradients asynchronously until the optimizer's step(): the scaler may unscale them only "
         "after `optimizer.synchronize()`, which a plain optimizer lacks. Where the wrap is on every path to the step, "
         "ampify writes horovod's recipe (synchronize(), then the step under `skip_synchronize()`); where it is not, "
         "it refuses.", "if args.horovod:\n    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=...)",
         MANUAL, incomplete=True),
    Rule("AMP241", "warning", "a custom autograd Function breaks under autocast (backward() mixes dtypes, or compiled code); file not converted",
         "Autocast casts the ops a Function's forward() runs, never its backward(): StyleGAN2's conv2d_gradfix "
         "convolves the float16 gradient with the float32 weight it saved and raises at the first step; a compiled "
         "extension (`fused = load(...)`, `import DCN_cuda`) gets float16 activations beside float32 weights. "
         "`@torch.amp.custom_fwd(device_type=..., cast_inputs=torch.float32)` on forward() and "
         "`@torch.amp.custom_bwd(device_type=...)` on backward() run it in float32; ampify then converts. "
         "Dtype-agnostic Functions (gradient reversal, straight-through estimators) are not flagged.",
         "class Conv2d(autograd.Function):\n    @staticmethod\n    def backward(ctx, grad_output):\n"
         "        return F.conv_transpose2d(grad_output, weight), ...", MANUAL, incomplete=True),
    Rule("AMP242", "warning", "a custom autograd Function's backward() ignores the gradient it receives: the loss scale stops there; file not converted (float16)",
         "GradScaler multiplies the loss by 65536 and divides the gradients by it before the step: every backward() "
         "must pass the factor on. warp-ctc-style losses compute the gradient in forward() and `return ctx.grads, "
         "None, ...`: the layers before them get unscaled gradients, divided by the scale anyway, and training "
         "silently stalls. Multiplying by grad_output fixes it; --dtype bfloat16 needs no scaling and converts.",
         "class _CTC(Function):\n    @staticmethod\n    def backward(ctx, grad_output):\n"
         "        return ctx.grads, None, None", MANUAL, incomplete=True),
    Rule("AMP243", "warning", "warpctc_pytorch / warprnnt_pytorch: builds whose backward() ignores the incoming gradient lose the loss scale; check yours",
         "SeanNaren's warp-ctc binding returned the gradient its forward() computed without multiplying by "
         "grad_output until August 2020 (commit 11ecadd); later builds multiply. The file is converted, and "
         "reported incomplete until the user has checked the installed build, or switched to torch.nn.CTCLoss.",
         "from warpctc_pytorch import CTCLoss", MANUAL, incomplete=True),
    Rule("AMP244", "warning", "a probability clamp `clamp(p, lo, 1 - eps)` before `log(1 - p)` rounds to 1 in float16 / bfloat16: the loss turns inf or NaN; file not converted",
         "A focal loss (yhenon/pytorch-retinanet) clamps the sigmoid's output to [1e-4, 1 - 1e-4] and takes "
         "log(1 - p). Under autocast p arrives in float16, where 1 - 1e-4 rounds to 1.0: a confident anchor gives "
         "log(0) = -inf, and `(1 - target) * log(1 - p)` is 0 * -inf = NaN for a positive one; GradScaler skips "
         "every such step (with bfloat16, eps up to 2**-9 rounds away too, and the NaN reaches the weights). "
         "Clamping a float32 copy (`torch.clamp(p.float(), ...)`) keeps the bound.",
         "classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)\n"
         "bce = -(targets * torch.log(classification) + (1.0 - targets) * torch.log(1.0 - classification))",
         MANUAL, incomplete=True),
    Rule("AMP245", "info", "a Gram matrix function computes in float32: its body under `torch.autocast(..., enabled=False)` on a float32 copy of the feature map",
         "Style transfer's Gram matrix (pytorch/examples' fast_neural_style `utils.gram_matrix`) sums h*w products, "
         "past float16's 65504 (AMP238). With autocast off inside the function and the feature map copied to "
         "float32, it computes exactly what the fp32 script did; the caller's autocast resumes on return. Done for a "
         "module-level function or a method whose one required parameter is the feature map, in the training file "
         "or in a module of the same run (written with the training file as one change set).",
         "def gram_matrix(y):\n    (b, ch, h, w) = y.size()\n  -> def gram_matrix(y):\n"
         "         with torch.autocast(device_type=y.device.type, enabled=False):\n             y = y.float()\n"
         "             (b, ch, h, w) = y.size()", REVIEW),
    Rule("AMP246", "info", "a probability clamp `clamp(p, lo, 1 - eps)` before `log(1 - p)` now clamps a float32 copy (`clamp(p.float(), ...)`)",
         "The bound 1 - eps of a focal loss's clamp rounds to 1 in float16 (AMP244). Clamping a float32 copy keeps it, "
         "and the log that follows runs in float32; in float32 `.float()` returns the tensor itself, so the fp32 "
         "script computes what it did. In the training file itself, or in model code it imports (written with it as "
         "one change set).",
         "classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)\n"
         "  -> classification = torch.clamp(classification.float(), 1e-4, 1.0 - 1e-4)", REVIEW),
    Rule("AMP247", "info", "a custom autograd Function that breaks under autocast runs in float32: `torch.amp.custom_fwd(device_type=\"cuda\", cast_inputs=torch.float32)` on forward(), `torch.amp.custom_bwd(device_type=\"cuda\")` on backward()",
         "PyTorch's AMP documentation gives these decorators for Functions that need float32 (AMP241: a backward() "
         "mixing the float16 gradient with saved float32 tensors, a compiled extension written for float32). Under "
         "CUDA autocast the Function then computes in float32, as in the fp32 script; outside autocast the "
         "decorators do nothing. In the training file itself, or in model code it imports (written with it as one "
         "change set); not on apex, whose O1 ignores them, nor for an autocast region on the CPU.",
         "    @staticmethod\n    def forward(ctx, indices, values, shape, b):\n  -> @staticmethod\n"
         "     @torch.amp.custom_fwd(device_type=\"cuda\", cast_inputs=torch.float32)\n"
         "     def forward(ctx, indices, values, shape, b):", REVIEW),
    Rule("AMP236", "info", "ShardedGradScaler for a FullyShardedDataParallel model",
         "A file that wraps its model in FullyShardedDataParallel (FSDP1) gets "
         "torch.distributed.fsdp.sharded_grad_scaler.ShardedGradScaler, imported, in place of torch.amp.GradScaler: "
         "its unscale_ all-reduces the inf/NaN check, so every rank skips the same steps.",
         "model = FSDP(model); optimizer = AdamW(model.parameters())\n  -> scaler = ShardedGradScaler(\"cuda\")", SAFE),
    Rule("AMP235", "info", "`import torch` added: the file trains without importing torch, and a project module it imports does",
         "The new autocast and GradScaler code is spelled through `torch`; the training objects come from project "
         "modules that import torch (SPADE's trainer imports its model module).",
         "from models.pix2pix_model import Pix2PixModel  # the file's only import\n  -> import torch\n"
         "     from models.pix2pix_model import Pix2PixModel", REVIEW),
    Rule("AMP229", "warning", "the log of a sigmoid's probability (`torch.log(1 - D(x))`) is -inf under autocast; file not converted",
         "A GAN (or VAE, or Bernoulli policy) that writes its cross entropy out: the sigmoid runs in float16 after "
         "the model's last Linear, its output rounds to 1 once the logit passes about 8.4 (to 0 below about -17.4) "
         "and the `+ 1e-8` is lost, so the log is -inf, the loss inf, and GradScaler skips every step while the "
         "discriminator is confident, silently (bfloat16 rounds at 6.3). autocast refuses BCELoss for this reason; "
         "the written-out form raises nothing. An epsilon of 1e-4 or more keeps the log finite and is not flagged. "
         "The model may be a class of another project module the file imports (`from models import "
         "Discriminator`); a sigmoid taken of a float64 or float32 copy (`self.sig(self.linear(h).double())`) is "
         "safe and not flagged.",
         "D_loss = -torch.mean(torch.log(D_real + 1e-8) + torch.log(1 - D_fake + 1e-8))", MANUAL, incomplete=True),
    Rule("AMP230", "info", "gradient penalty (or a step's own `autograd.grad`) scaled: `autograd.grad` of `scaler.scale(outputs)`, gradients divided by `scaler.get_scale()`",
         "A penalty's float16 gradients underflow unscaled; PyTorch's AMP examples scale the outputs and unscale the "
         "gradients. The same recipe serves a MAML inner loop's `grads = torch.autograd.grad(loss, params)` and "
         "adversarial examples' input gradients: an overflow there makes the step's loss inf, so the step is skipped "
         "and the scale lowered.",
         "g = torch.autograd.grad(outputs=d_out, inputs=x, create_graph=True)[0]\n"
         "  -> g = torch.autograd.grad(outputs=scaler.scale(d_out), inputs=x, create_graph=True)[0]\n"
         "     g = g / scaler.get_scale()", REVIEW),
    Rule("AMP231", "info", "BCE after a Sigmoid fused: the model's final `nn.Sigmoid()` (or returned `torch.sigmoid`) dropped, `BCEWithLogitsLoss` / `binary_cross_entropy_with_logits`, `torch.sigmoid` where the output is read as a probability",
         "Autocast and apex refuse BCELoss; BCEWithLogitsLoss on logits is the same loss, computed stably. Done only when every use of the output is followed.",
         "nn.Sequential(..., nn.Sigmoid()); criterion = nn.BCELoss(); D_x = output.mean().item()\n"
         "  -> nn.Sequential(...,); criterion = nn.BCEWithLogitsLoss(); D_x = torch.sigmoid(output).mean().item()", REVIEW),
    Rule("AMP248", "info", "the log of a model's sigmoid probability, written out, taken in float32: the model's final `nn.Sigmoid()` (or returned `torch.sigmoid`) dropped, `torch.sigmoid(out.float())` where a log reads its output",
         "A float16 sigmoid rounds to 1 once the logit passes about 8.4, and `log(1 - p + 1e-8)` is then -inf "
         "(AMP229). With the model ending on logits and the probability taken from a float32 copy of them where a "
         "log reads it, the loss computes the float32 probability the fp32 script did (other reads get "
         "`torch.sigmoid(...)` as they were). Done only when every use of the model's output is followed, as for "
         "AMP231, and no other log of a float16 probability is left.",
         "D = nn.Sequential(..., nn.Sigmoid()); d_loss = -torch.mean(torch.log(D(x) + 1e-8))\n"
         "  -> D = nn.Sequential(...,); d_loss = -torch.mean(torch.log(torch.sigmoid(D(x).float()) + 1e-8))", REVIEW),
    Rule("AMP249", "info", "an in-place matrix product in model code (`dist.addmm_(inputs, inputs.t())`) given matrices of its receiver's dtype (`inputs.to(dist.dtype)`)",
         "Autocast casts out-of-place products only. A triplet loss's `dist` is float32 (a `torch.pow` before it runs "
         "in float32) while the features are float16, and the in-place `addmm_` raises \"self and mat2 must have the "
         "same dtype\" on the first batch. Cast to the receiver's dtype the product runs in float32, as in the fp32 "
         "script, where the cast is a no-op. In forward() methods of the training file's classes, or of the model "
         "code it imports (written with it as one change set); a module not in the run leaves the file unconverted "
         "with a warning (AMP250).",
         "dist.addmm_(inputs, inputs.t(), beta=1, alpha=-2)\n"
         "  -> dist.addmm_(inputs.to(dist.dtype), inputs.t().to(dist.dtype), beta=1, alpha=-2)", REVIEW),
    Rule("AMP250", "warning", "the model code this file imports runs an in-place matrix product that raises under autocast, in a module not in this run: left as it is",
         "ampify casts the matrices of `dist.addmm_(inputs, inputs.t())` to the receiver's dtype (AMP249) in modules "
         "of the run; the file is converted, and if its step runs that code, the product raises on the first "
         "float16 batch until that module is converted too.",
         "from losses import TripletLoss  # losses.py not named: ampify train.py losses.py", MANUAL, incomplete=True),
    Rule("AMP251", "info", "a BCE of a sigmoid in the code the training file imports now takes the logits (`binary_cross_entropy_with_logits`)",
         "CUDA autocast refuses `F.binary_cross_entropy` / `nn.BCELoss`, wherever the step runs them: MUNIT's "
         "discriminator computes its own loss in networks.py. BCE with logits of the sigmoid's input is the same loss, "
         "computed stably. Done in a module the training file imports when every BCE there takes a sigmoid it applies "
         "itself (inline, or through names read once), written with the training file as one change set; otherwise "
         "AMP252.",
         "loss = F.binary_cross_entropy(F.sigmoid(out0), all0)\n"
         "  -> loss = F.binary_cross_entropy_with_logits(out0, all0)", REVIEW),
    Rule("AMP252", "warning", "the code this file imports, or that the script running it hands it, computes BCE on probabilities, which autocast refuses, and ampify could not fuse it there: left as it is",
         "The file is converted, and if its step runs that loss, it raises on the first batch. Said when the BCE "
         "does not take a sigmoid the module applies itself, when that module is not in this run, or trains itself.",
         "from losses import BCEDiceLoss  # F.binary_cross_entropy(probabilities, target) there", MANUAL,
         incomplete=True),
    Rule("AMP253", "warning", "a class of a module not in this run trains each time it is called (backward() and a step in its forward(), or in a method of a trainer this file builds): that step stays float32, or is unscaled",
         "EDSR's adversarial loss updates its discriminator inside `Adversarial.forward()`. Called from this file's "
         "step it runs under autocast, and its backward() has no GradScaler: float16 gradients can underflow. "
         "DARTS' `architect.step(...)` trains the architecture in architect.py: outside this file's autocast it "
         "stays float32. Converted in its own module when that module is in this run (a scaler of its own); "
         "otherwise the conversion of this file is incomplete and names it.",
         "loss = self.loss(sr, hr)  # loss/adversarial.py: Adversarial.forward() runs loss_d.backward(); self.optimizer.step()",
         MANUAL, incomplete=True),
    Rule("AMP254", "warning", "an optimizer step whose gradients another call computes (no backward() of this step between its zero_grad() and step()) is left a plain step, in float32",
         "khanrc/pt.darts steps the architecture with `alpha_optim.step()` after `architect.unrolled_backward(...)`, "
         "a backward in another module. GradScaler would divide those gradients, never scaled, by the loss scale: "
         "the step stays a plain step, the call computing its gradients stays outside autocast (float32), and "
         "the weights' step converts. Refused when that call would run under autocast, and with apex (O1 casts "
         "everywhere).",
         "alpha_optim.zero_grad()\narchitect.unrolled_backward(trn_X, trn_y, val_X, val_y, lr, w_optim)\n"
         "alpha_optim.step()  # left as it is", MANUAL, incomplete=True),
    Rule("AMP255", "warning", "the optimizer is handed to a training loop of a third-party library (torchnet's Engine, homura's trainers): its step is there, and nothing is converted",
         "szagoruyko/attention-transfer hands its SGD to torchnet's `Engine().train(h, loader, epochs, optimizer)`, "
         "whose loop calls backward() and `optimizer.step(closure)`. The file has no backward() of its own, but it "
         "trains: it is refused with the library's name, not reported as inference code. Said for a callee named "
         "like a loop (train, fit, Trainer, Engine, Learner, Runner) of a package outside the standard library, "
         "torch and the project.",
         "engine = Engine()\nengine.train(h, train_loader, opt.epochs, optimizer)  # torchnet runs the step", MANUAL),
    Rule("AMP256", "info", "a sigmoid whose probability a log reads now takes a float32 copy of the logits: `torch.sigmoid(x.float())`",
         "kwotsin/mimicry's non-saturating loss, `p = torch.sigmoid(logits)` then `torch.log(p + 1e-8)`: under autocast "
         "the sigmoid runs in float16, where p is 0 for a logit below about -17 and the log is -inf (AMP229). On a "
         "float32 copy the probability and its log are what the fp32 script computed (`.float()` of a float32 tensor "
         "is the tensor itself). Done for sigmoids written out whose value reaches the log through names of the same "
         "function, in this file or, as one change set, in the module it imports that computes the loss; a model "
         "ending in nn.Sigmoid is fused instead (AMP248) or refused (AMP229).",
         "output_fake = torch.sigmoid(output_fake)\n  -> output_fake = torch.sigmoid(output_fake.float())", REVIEW),
    Rule("AMP257", "warning", "a class of another module that this step builds takes a gradient penalty in a method (torch.autograd.grad with create_graph=True): under float16 autocast its gradients are unscaled, so the training steps are left unconverted",
         "huangzh13/StyleGAN.pytorch's `LogisticGAN.R1Penalty()` (models/Losses.py) differentiates the "
         "discriminator's output with respect to the real images; GAN.py's step computes it through "
         "`self.loss.dis_loss(...)`. Under autocast those input gradients are float16 and not scaled: small ones "
         "flush to zero, and the penalty the fp32 script applies is lost. A penalty function of another module is "
         "threaded the GradScaler (AMP230); one in a method of a class is not, so the file is refused with "
         "float16 (bfloat16 keeps float32's range: it converts).",
         "real_grads = torch.autograd.grad(outputs=real_logit, inputs=real_img, create_graph=True)[0]  "
         "# models/Losses.py, run by GAN.py's step", MANUAL),
    Rule("AMP232", "info", "`masked_fill(mask, -1e9)` before a softmax: the constant is now `torch.finfo(scores.dtype).min`",
         "-1e9 overflows float16, and masked_fill raises once the scores are float16 (autocast, apex O1). The scores' own "
         "minimum gives the same softmax in float32. Done only when the filled scores are read by a softmax alone; "
         "in a module the training file imports, written with it as one change set.",
         "scores = scores.masked_fill(mask == 0, -1e9)\n"
         "  -> scores = scores.masked_fill(mask == 0, torch.finfo(scores.dtype).min)", REVIEW),
    Rule("AMP233", "info", "an optimizer wrapper class of the project steps through the GradScaler: its stepping method takes `scaler=None`",
         "GradScaler must step the optimizer inside `ScheduledOptim` (a wrapper has no param_groups). The method keeps "
         "stepping as before without a scaler; one that clips first unscales first. Written with the training file as "
         "one change set.",
         "def step_and_update_lr(self):\n    self._optimizer.step()\n"
         "  -> def step_and_update_lr(self, scaler=None):\n    if scaler is not None:\n        scaler.step(self._optimizer)\n"
         "    else:\n        self._optimizer.step()", REVIEW),
    Rule("AMP300", "error", "error: internal error in the apex transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP300 internal error in the torch-apex-amp transform (KeyError: ...); this file is left unchanged", MANUAL),
    Rule("AMP301", "info", "`amp.initialize(...)` added after the optimizer(s)",
         "apex patches the model and optimizer once both exist and the model is on the GPU.",
         'optimizer = optim.SGD(...)\n  -> model, optimizer = amp.initialize(model, optimizer, opt_level="O1")', REVIEW),
    Rule("AMP302", "info", "`backward()` wrapped in `amp.scale_loss`",
         "apex scales the loss inside the context manager.",
         "loss.backward()\n  -> with amp.scale_loss(loss, optimizer) as scaled_loss:\n         scaled_loss.backward()", SAFE),
    Rule("AMP303", "info", "clipping reads `amp.master_params(optimizer)`",
         "Under apex the parameters the optimizer steps are the master parameters.",
         "clip_grad_norm_(model.parameters(), 1.0)\n  -> clip_grad_norm_(amp.master_params(optimizer), 1.0)", SAFE),
    Rule("AMP304", "info", "`amp.state_dict()` saved and restored with the checkpoint",
         "apex's loss scale is state of its own.",
         '"optimizer": optimizer.state_dict()\n  -> ..., "amp": amp.state_dict()', REVIEW),
    Rule("AMP305", "info", "`from apex import amp` added",
         "The apex backend needs its import.", "+from apex import amp", SAFE),
    Rule("AMP306", "info", "DataParallel/DDP wrap moved after `amp.initialize`",
         "amp.initialize rejects wrapped models; the wrap has no parameters of its own, so moving it is exact.",
         "model = nn.DataParallel(model)\noptimizer = ...\n  -> optimizer = ...\n     model, optimizer = amp.initialize(...)\n"
         "     model = nn.DataParallel(model)", REVIEW),
    Rule("AMP307", "info", "apex set up in another module: `amp.initialize` where the optimizer is created, `amp.scale_loss` in the step",
         "amp is a process-wide singleton: the optimizer the caller passes in is already patched when the step runs; both files are written as one change set.",
         "train_one_epoch(model, loader, optimizer)  # main.py\n  -> model, optimizer = amp.initialize(model, optimizer, opt_level=\"O1\")\n"
         "     train_one_epoch(model, loader, optimizer)", REVIEW),
    Rule("AMP308", "info", "optimizer built above the DataParallel/DDP wrap, `amp.initialize` before the wrap",
         "amp.initialize rejects wrapped models; DDP's parameters are those of the model it wraps, in the same order, so "
         "the optimizer built from the model before the wrap is the same optimizer.",
         "ddp_model = DDP(model)\noptimizer = SGD(ddp_model.parameters())\n  -> optimizer = SGD(model.parameters())\n"
         "     model, optimizer = amp.initialize(...)\n     ddp_model = DDP(model)", REVIEW),
    Rule("AMP310", "warning", "`BCELoss` / `binary_cross_entropy`: apex raises on it; file not converted",
         "apex O1 raises on BCELoss: use BCEWithLogitsLoss.", "criterion = nn.BCELoss()", MANUAL),
    Rule("AMP311", "warning", "`optimizer.step(closure)`: apex does not support closures; file not converted",
         "apex cannot scale a loss computed inside a closure.", "optimizer.step(closure)", MANUAL, incomplete=True),
    Rule("AMP312", "warning", "gradient penalty (`create_graph=True`), or a step's own `autograd.grad`, not scaled by `amp.scale_loss`",
         "The penalty's gradients are computed unscaled in float16. Reported where ampify cannot scale them itself "
         "(AMP328): several outputs differentiated at once, a shape the native backend does not follow either.",
         "torch.autograd.grad([d_out_a, d_out_b], x, create_graph=True)", MANUAL, incomplete=True),
    Rule("AMP313", "warning", "`masked_fill` with a constant that overflows float16 under O1; file not converted",
         "apex does not patch masked_fill: on float16 scores -1e9 raises `value cannot be converted to type at::Half "
         "without overflow`.", "scores.masked_fill(mask, -1e9)", MANUAL),
    Rule("AMP314", "warning", "optimizer wrapper class with its own `step()`",
         "amp.initialize needs the real optimizer, hidden inside the wrapper.",
         "class ScheduledOptim:\n    def step(self): self._optimizer.step()", MANUAL),
    Rule("AMP315", "warning", "`torch.autograd.backward(...)` not rewritten",
         "Only `loss.backward()` is wrapped in amp.scale_loss.", "torch.autograd.backward(losses)", MANUAL, incomplete=True),
    Rule("AMP316", "warning", "`backward()` with no optimizer step that can be identified",
         "amp.scale_loss needs the optimizer the gradients go to.", "loss.backward()  # stepped elsewhere", MANUAL, incomplete=True),
    Rule("AMP317", "warning", "training loop refused for apex: its structure cannot be followed (the reason follows)",
         "When ampify cannot be sure, it refuses with the true reason instead of writing a wrong conversion.",
         "net = nn.DataParallel(ssd_net)  # amp.initialize(net) would raise", MANUAL, incomplete=True),
    Rule("AMP318", "warning", "checkpoint form not followed: save/restore `amp` state by hand",
         "A resumed run would restart apex's loss scale.", "torch.save(state, path)  # a form ampify does not follow", MANUAL),
    Rule("AMP319", "warning", "optimizer state loaded before `amp.initialize`",
         "apex wants amp.initialize before optimizer.load_state_dict (its master weights).",
         "optimizer.load_state_dict(ckpt['optimizer'])\nmodel, optimizer = amp.initialize(...)", MANUAL),
    Rule("AMP320", "warning", "FullyShardedDataParallel: apex amp does not support it; file not converted",
         "apex cannot initialize FSDP models; use the native backend with bfloat16 or FSDP's MixedPrecision.",
         "model = FSDP(model)", MANUAL, incomplete=True),
    Rule("AMP321", "warning", "hand-made half precision (`.half()`): amp.initialize raises on float16 models; file not converted",
         "apex expects float32 models and does the casting itself.", "model = model.half()", MANUAL, incomplete=True),
    Rule("AMP322", "warning", "the file uses mixed precision, but not around this training step: nothing converted",
         "The training step still runs in float32.", "with amp.scale_loss(...)  # only in another loop", MANUAL, incomplete=True),
    Rule("AMP323", "warning", "the file trains but never imports torch by name; not converted",
         "Without `import torch` the apex conversion cannot be spelled here.",
         "from model import *\nloss.backward()\noptimizer.step()", MANUAL, incomplete=True),
    Rule("AMP324", "warning", "an optimizer step with no `backward()` in this file: the backward pass runs elsewhere",
         "amp.scale_loss must wrap the backward that feeds this step, which this file cannot see.",
         "engine.backward_pass(loss)\noptimizer.step()", MANUAL, incomplete=True),
    Rule("AMP325", "warning", "Opacus (DP-SGD) training: apex amp cannot scale per-sample gradients; file not converted",
         "Opacus's DPOptimizer clips per-sample gradients, which amp.scale_loss would scale.",
         "model, optimizer, loader = privacy_engine.make_private(...)", MANUAL, incomplete=True),
    Rule("AMP326", "warning", "RPC training (`torch.distributed.autograd.backward` + DistributedOptimizer): apex amp cannot scale it; file not converted",
         "The gradients live in a distributed autograd context that a DistributedOptimizer steps; amp.scale_loss and "
         "amp.initialize need a local optimizer.",
         _RPC_EXAMPLE, MANUAL, incomplete=True),
    Rule("AMP328", "info", "gradient penalty scaled with apex's loss scale",
         "apex has no GradScaler.scale() for autograd.grad (apex issue #873); its loss scale is public "
         "(`amp.state_dict()[\"loss_scaler<k>\"][\"loss_scale\"]`). The penalty's gradients are taken of the outputs "
         "times that scale in float32 and divided by it, k being the loss the penalty is added to: an overflow there "
         "makes that loss's scaler skip the step and lower the very scale read.",
         "g = autograd.grad(outputs=d_out, inputs=x, create_graph=True)[0]\n  -> penalty_scale = "
         "amp.state_dict()[\"loss_scaler0\"][\"loss_scale\"]\n     g = autograd.grad(outputs=d_out.float() * "
         "penalty_scale, inputs=x, create_graph=True)[0]\n     g = g / penalty_scale", REVIEW),
    Rule("AMP327", "warning", "the training step this file runs (with its optimizer, or wholly) is in a module not in this run; not converted",
         "amp.initialize goes after the optimizer in the driver and amp.scale_loss around the backward in the engine: one "
         "change set for both files, so both must be in the run.",
         "train_one_epoch(model, criterion, loader, optimizer, device)  # engine.py not named", MANUAL, incomplete=True),
    Rule("AMP329", "warning", "apex: a training step of this file stays unconverted, so no step of it is converted; file not converted",
         "amp.initialize (O1) patches torch's functions for the whole process: a step left out would run in float16 "
         "without loss scaling, worse than float32. The warnings name the step and why it was left out.",
         "G step converted, D step refused (gradient penalty of another module)  # D would train unscaled", MANUAL,
         incomplete=True),
    Rule("AMP330", "warning", "apex: a Gram matrix (`torch.mm(f, f.t())`) overflows float16 under O1; file not converted",
         "Style transfer's Gram matrices sum h*w products of feature maps: beyond 65504 the loss is inf and every "
         "step is skipped.", "G = torch.mm(f, f.t())", MANUAL, incomplete=True),
    Rule("AMP331", "warning", "apex: the log of a sigmoid's probability (`torch.log(1 - D(x))`) is -inf under O1; file not converted",
         "O1 runs the sigmoid after the model's last Linear in float16: its output rounds to 1 once the logit passes "
         "about 8.4 and the `+ 1e-8` is lost, so the log is -inf and every step is skipped while the discriminator "
         "is confident. The model may be a class of another project module the file imports.", "D_loss = -torch.mean(torch.log(D_real + 1e-8) + torch.log(1 - D_fake + 1e-8))", MANUAL,
         incomplete=True),
    Rule("AMP332", "warning", "apex: an optimizer handed through code ampify does not follow; its steps left unconverted",
         "amp.initialize accepts torch optimizers (and LARC) only: handed a wrapper of an unread class it raises.",
         "optimizer = Optimizer(torch.optim.Adam(model.parameters()), max_grad_norm=5)  # from seq2seq.optim", MANUAL,
         incomplete=True),
    Rule("AMP333", "warning", "apex: horovod's `DistributedOptimizer`: not converted",
         "amp.scale_loss unscales the gradients when its block ends, while horovod may still be averaging them, and "
         "amp.initialize must patch the optimizer horovod wraps; horovod's recipe calls `optimizer.synchronize()` "
         "inside the block and steps under `skip_synchronize()`. The native backend writes its recipe.",
         "optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=...)", MANUAL, incomplete=True),
    Rule("AMP334", "warning", "apex: a custom autograd Function breaks under O1 (backward() mixes dtypes, or compiled code); file not converted",
         "O1 patches the torch functions a Function's forward() calls; its backward() and compiled extensions get "
         "float16 tensors beside float32 ones.", "class Conv2d(autograd.Function): ...", MANUAL, incomplete=True),
    Rule("AMP335", "warning", "apex: a custom autograd Function's backward() ignores the gradient it receives: the loss scale stops there; file not converted",
         "amp.scale_loss multiplies the loss and unscales the gradients afterwards: a backward() returning the "
         "gradient its forward() computed (warp-ctc's `return ctx.grads, None, ...`) leaves the layers before it "
         "unscaled.", "class _CTC(Function): ...  return ctx.grads, None, None", MANUAL, incomplete=True),
    Rule("AMP336", "warning", "apex: warpctc_pytorch / warprnnt_pytorch: builds whose backward() ignores the incoming gradient lose the loss scale; check yours",
         "As AMP243, under amp.scale_loss.", "from warpctc_pytorch import CTCLoss", MANUAL, incomplete=True),
    Rule("AMP337", "warning", "apex: a probability clamp `clamp(p, lo, 1 - eps)` before `log(1 - p)` rounds to 1 in float16; file not converted",
         "As AMP244, under O1: the sigmoid's output is float16, the clamp's bound 1 - eps rounds to 1, log(1 - p) "
         "is -inf and the loss inf or NaN.", "classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)",
         MANUAL, incomplete=True),
    Rule("AMP339", "info", "apex: a probability clamp `clamp(p, lo, 1 - eps)` before `log(1 - p)` now clamps a float32 copy",
         "As AMP246, under O1: apex does not patch clamp, so the float32 copy keeps the bound and the log runs in "
         "float32.", "classification = torch.clamp(classification, 1e-4, 1.0 - 1e-4)\n"
         "  -> classification = torch.clamp(classification.float(), 1e-4, 1.0 - 1e-4)", REVIEW),
    Rule("AMP340", "info", "apex: an in-place matrix product in model code given matrices of its receiver's dtype (`inputs.to(dist.dtype)`)",
         "As AMP249, under O1: apex runs torch.pow in float32 and patches no in-place product, so `dist.addmm_(inputs, "
         "inputs.t())` on float16 features raises; cast, it runs in float32, a no-op in the fp32 script.",
         "dist.addmm_(inputs, inputs.t(), beta=1, alpha=-2)\n"
         "  -> dist.addmm_(inputs.to(dist.dtype), inputs.t().to(dist.dtype), beta=1, alpha=-2)", REVIEW),
    Rule("AMP341", "warning", "apex: the model code this file imports runs an in-place matrix product that raises under O1, in a module not in this run: left as it is",
         "As AMP250: the file is converted, and if its step runs that code, the product raises on the first float16 "
         "batch until that module is converted too.",
         "from losses import TripletLoss  # losses.py not named: ampify --backend apex train.py losses.py", MANUAL,
         incomplete=True),
    Rule("AMP342", "info", "apex: a BCE of a sigmoid in the code the training file imports now takes the logits (`binary_cross_entropy_with_logits`)",
         "As AMP251: apex O1 refuses `F.binary_cross_entropy` too (it asks for the logits form).",
         "loss = F.binary_cross_entropy(F.sigmoid(out0), all0)\n"
         "  -> loss = F.binary_cross_entropy_with_logits(out0, all0)", REVIEW),
    Rule("AMP343", "warning", "apex: the code this file imports, or that the script running it hands it, computes BCE on probabilities, which O1 refuses, and ampify could not fuse it there: left as it is",
         "As AMP252.", "from losses import BCEDiceLoss  # F.binary_cross_entropy(probabilities, target) there", MANUAL,
         incomplete=True),
    Rule("AMP344", "warning", "apex: a class of a module not in this run trains each time it is called (backward() and a step in its forward(), or in a method of a trainer this file builds): its step is not scaled",
         "As AMP253; under O1 that step runs in float16 wherever it is called, with no amp.scale_loss.",
         "loss = self.loss(sr, hr)  # loss/adversarial.py: Adversarial.forward() runs loss_d.backward(); self.optimizer.step()",
         MANUAL, incomplete=True),
    Rule("AMP345", "warning", "apex: the optimizer is handed to a training loop of a third-party library: its backward() is there, and nothing is converted",
         "As AMP255: amp.scale_loss would have to wrap the library's backward().",
         "engine = Engine()\nengine.train(h, train_loader, opt.epochs, optimizer)  # torchnet runs the step", MANUAL),
    Rule("AMP346", "info", "apex: a sigmoid whose probability a log reads now takes a float32 copy of the logits: `torch.sigmoid(x.float())`",
         "As AMP256: under O1 the sigmoid keeps its input's dtype, float32 after `.float()`.",
         "output_fake = torch.sigmoid(output_fake)\n  -> output_fake = torch.sigmoid(output_fake.float())", REVIEW),
    Rule("AMP347", "warning", "apex: a class of another module that this step builds takes a gradient penalty in a method: under O1 its gradients are unscaled, so the training steps are left unconverted",
         "As AMP257: O1 runs that penalty in float16 with no loss scale on its torch.autograd.grad.",
         "real_grads = torch.autograd.grad(outputs=real_logit, inputs=real_img, create_graph=True)[0]  "
         "# models/Losses.py, run by GAN.py's step", MANUAL),
    Rule("AMP500", "error", "error: internal error in the Keras transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP500 internal error in the keras-mixed-precision transform (KeyError: ...); this file is left unchanged", MANUAL),
    Rule("AMP501", "info", "Keras: `set_global_policy(\"mixed_float16\")` (or `mixed_bfloat16`) after the imports, before any model is built",
         "A policy set after a model is built silently does nothing; compile then wraps the optimizer in a "
         "LossScaleOptimizer by itself, so fit needs no more.",
         'import keras\n  -> import keras\n     keras.mixed_precision.set_global_policy("mixed_float16")', SAFE),
    Rule("AMP502", "info", "Keras: `dtype=\"float32\"` on the model's output layer",
         "The Keras mixed precision guide keeps the model's outputs (and so the loss) in float32 for numeric stability.",
         'layers.Dense(10, activation="softmax")\n  -> layers.Dense(10, activation="softmax", dtype="float32")', SAFE),
    Rule("AMP503", "info", "Keras custom loop: the optimizer wrapped in a `LossScaleOptimizer`, the loss scaled inside the tape, the gradients unscaled (Keras 2) before `apply_gradients`",
         "Keras 3 scales with `scale_loss` and unscales in apply_gradients; Keras 2 needs get_scaled_loss and "
         "get_unscaled_gradients. Where the imports cannot tell which Keras runs, the form that works on both is written.",
         "grads = tape.gradient(loss, vars)\n  -> (inside the tape) scaled_loss = opt.scale_loss(loss) if hasattr(opt, \"scale_loss\") "
         "else opt.get_scaled_loss(loss)\n     grads = tape.gradient(scaled_loss, vars)", REVIEW),
    Rule("AMP504", "info", "Keras: the experimental mixed precision API (TF 2.1-2.3) migrated to the current one (`set_policy` -> `set_global_policy`, `experimental.` dropped)",
         "tf.keras.mixed_precision.experimental is gone from current TensorFlow and from Keras 3: such scripts fail at "
         "import or at the first call.",
         "from tensorflow.keras.mixed_precision import experimental as mixed_precision\n"
         "  -> from tensorflow.keras import mixed_precision", SAFE),
    Rule("AMP510", "warning", "Keras: a custom `tf.GradientTape` loop in a shape ampify cannot scale (the reason follows); not converted",
         "A custom loop needs a LossScaleOptimizer and a scaled loss; a policy alone would train float16 gradients unscaled.",
         "optimizer = make_optimizer()  # built in another module", MANUAL),
    Rule("AMP511", "warning", "Keras imported only inside functions: the policy cannot be set before the model is built; not converted",
         "The policy call goes at the top of the module, where Keras must already be imported.",
         "def main():\n    from tensorflow import keras", MANUAL),
    Rule("AMP512", "warning", "Keras: the model's output layer is not found in this file (keras.applications, subclassed models, outputs built elsewhere): cast it to float32 by hand",
         "The policy applies, but the outputs stay float16, which the Keras guide advises against for the loss.",
         "model = tf.keras.applications.ResNet50(weights=None, classes=10)", MANUAL),
    Rule("AMP513", "warning", "multi-backend Keras (before 2.4: `Convolution2D`, `np_utils`, `nb_epoch`...): no mixed precision API; not converted",
         "Keras 2.4 and tf.keras in TensorFlow 2.4 add keras.mixed_precision; such a script must be ported first.",
         "from keras.layers import Convolution2D\nmodel.fit(x, y, nb_epoch=10)", MANUAL),
    Rule("AMP514", "warning", "Keras: experimental mixed precision API with no current equivalent both Kerases take (a static loss scale, LossScale objects, a Policy with its own loss scale); left as it is",
         "Keras 2 spells a static scale dynamic=False, initial_scale=N; Keras 3's LossScaleOptimizer is dynamic only.",
         "tf.keras.mixed_precision.experimental.LossScaleOptimizer(opt, 1024)", MANUAL),
    Rule("AMP515", "warning", "Keras: a custom layer makes a `tf.Variable` by hand; it is not cast to the layer's float16 compute dtype",
         "add_weight's variables are cast to the layer's compute dtype inside call(); a hand-made tf.Variable stays "
         "float32, and a matmul of float16 inputs with it fails with a dtype error.",
         "self.w = tf.Variable(tf.random.normal([units, units]))\n  -> self.w = self.add_weight(shape=(units, units))",
         MANUAL, incomplete=True),
    Rule("AMP516", "warning", "Keras: `tf.cast(..., tf.float32)` inside a custom layer's `call`: what follows runs in float32",
         "The policy sets the compute dtype; a cast to float32 takes the rest of the layer out of it. Deliberate for "
         "a softmax or a norm; otherwise cast to self.compute_dtype.",
         "x = tf.cast(inputs, tf.float32)\n  -> x = tf.cast(inputs, self.compute_dtype)", MANUAL),
    Rule("AMP517", "warning", "Keras: TPU code converted with mixed_float16; TPUs compute in bfloat16 (`--dtype bfloat16`)",
         "mixed_bfloat16 is the TPU policy: it needs no loss scale and keeps float32's range.",
         "strategy = tf.distribute.TPUStrategy(resolver)", MANUAL),
    Rule("AMP518", "warning", "Keras custom loop: the loss is computed from a model output that stays float16 (a subclassed model, an output layer not found)",
         "The Keras guide keeps outputs and losses in float32; a float16 loss loses precision and may overflow.",
         "loss = loss_fn(y, model(x))  # model = MyModel(), whose call() returns float16\n"
         "  -> loss = loss_fn(y, tf.cast(model(x), tf.float32))", MANUAL),
    Rule("AMP600", "error", "error: internal error in the MXNet Gluon transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP600 internal error in the gluon-amp transform (KeyError: ...); this file is left unchanged", MANUAL),
    Rule("AMP601", "info", "MXNet: `from mxnet.contrib import amp` and `amp.init()` (or `target_dtype=\"bfloat16\"`) after the imports, before any network is built",
         "amp.init patches MXNet's operators; a network hybridized before it keeps a float32 graph without a word.",
         "import mxnet as mx\n  -> import mxnet as mx\n     from mxnet.contrib import amp\n     amp.init()", SAFE),
    Rule("AMP602", "info", "MXNet: `update_on_kvstore=False` on the `gluon.Trainer` and `amp.init_trainer(trainer)` after it",
         "init_trainer gives the trainer its dynamic loss scaler; a step whose gradients overflow is skipped, which "
         "needs the update done by the trainer, not the kvstore.",
         "trainer = gluon.Trainer(net.collect_params(), \"sgd\")\n  -> trainer = gluon.Trainer(net.collect_params(), "
         "\"sgd\", update_on_kvstore=False)\n     amp.init_trainer(trainer)", SAFE),
    Rule("AMP603", "info", "MXNet: the backward pass wrapped in `amp.scale_loss(loss, trainer)`, inside the `autograd.record()` block",
         "float16 gradients underflow without a loss scale; the scaling multiplies the loss, so it must be recorded: a "
         "backward right after the record block moves into it.",
         "loss.backward()\n  -> with amp.scale_loss(loss, trainer) as scaled_loss:\n         scaled_loss.backward()", REVIEW),
    Rule("AMP604", "info", "MXNet: `amp.unscale(trainer)` before the gradients are clipped or read",
         "Between scale_loss and trainer.step the gradients carry the loss scale: clip_global_norm would clip them "
         "65536 times too hard.",
         "gluon.utils.clip_global_norm(grads, 1.0)\n  -> amp.unscale(trainer)\n     gluon.utils.clip_global_norm(grads, 1.0)", SAFE),
    Rule("AMP610", "warning", "MXNet: a trainer or backward pass ampify cannot pair for loss scaling (the reason follows); not converted",
         "amp.scale_loss needs the trainer that applies the gradients; a guess would leave them scaled or unscaled.",
         "loss.backward()  # the trainer steps in another module", MANUAL),
    Rule("AMP611", "warning", "MXNet imported only inside functions: amp.init() cannot run before the network is built; not converted",
         "amp.init goes at the top of the module, where MXNet must already be imported.",
         "def main():\n    import mxnet as mx", MANUAL),
    Rule("AMP612", "warning", "MXNet: the symbolic Module API (`mod.fit`); not converted",
         "amp.init_trainer accepts only a Gluon Trainer (a bare Optimizer raises TypeError), so the loss of a Module "
         "cannot be scaled.",
         "mod = mx.mod.Module(symbol)\nmod.fit(train_iter, num_epoch=10)", MANUAL),
    Rule("AMP613", "warning", "MXNet: Horovod's `DistributedTrainer`; not converted",
         "Its gradient averaging changes the trainer's scale, which amp's loss scaling rewrites; ampify does not "
         "convert it unchecked.",
         "trainer = hvd.DistributedTrainer(params, \"sgd\")", MANUAL),
    Rule("AMP614", "warning", "MXNet: `update_on_kvstore` set to something other than False, kept as written",
         "With the update on the kvstore, a step whose scaled gradients overflow is applied before amp can skip it.",
         "gluon.Trainer(params, \"sgd\", update_on_kvstore=True)", MANUAL, incomplete=True),
    Rule("AMP615", "warning", "MXNet 2.0 numpy-interface code (`npx.set_np()`, `mx.np`): its AMP is `mxnet.amp`; not converted",
         "This target writes MXNet 1.6-1.9's mxnet.contrib.amp, which MXNet 2.0 moved and changed.",
         "mx.npx.set_np()\nnet = nn.Dense(10)", MANUAL),
    Rule("AMP400", "error", "error: internal error in the migration transform; the file is left unchanged",
         "A bug in ampify must never cost a file: the file is left as it was and the run goes on.",
         "AMP400 internal error in the torch-amp-migration transform (KeyError: ...); this file is left unchanged", MANUAL),
    Rule("AMP401", "info", "deprecated `torch.cuda.amp` / `torch.cpu.amp` callable migrated to `torch.amp` (device first, old positional arguments by name)",
         "torch warns FutureWarning for torch.cuda.amp.autocast, GradScaler, custom_fwd and custom_bwd (and the torch.cpu.amp "
         "ones); torch.amp takes the device first, so old positional arguments are passed by name, never shifted.",
         "torch.cuda.amp.autocast(True, torch.bfloat16)\n  -> torch.amp.autocast(\"cuda\", enabled=True, dtype=torch.bfloat16)", SAFE),
    Rule("AMP402", "info", "import of the deprecated module rewritten (`from torch.cuda.amp import ...` -> `from torch.amp import ...`)",
         "Every import form is rewritten with its uses, so no deprecated import is left behind and no name goes unbound.",
         "from torch.cuda import amp\n  -> from torch import amp", SAFE),
    Rule("AMP403", "info", "apex amp migrated to torch.amp: `amp.initialize` / `amp.scale_loss` / `amp.master_params` / apex checkpoint state removed, then converted natively",
         "apex.amp was removed from apex after release 25.05: such scripts no longer run on a current apex. apex is taken out "
         "exactly and the native conversion adds autocast and a GradScaler with all its checks; the file changes only when both succeed.",
         "with amp.scale_loss(loss, optimizer) as scaled_loss:\n    scaled_loss.backward()\n  -> scaler.scale(loss).backward()", REVIEW),
    Rule("AMP410", "warning", "deprecated `torch.cuda.amp` use with no exact `torch.amp` equivalent; the file is left as it is",
         "The new callables need the device as an argument, which a value reference called with positional "
         "arguments (`ac = torch.cuda.amp.autocast` ... `with ac(True):`), a fallback definition for old torch, or "
         "*args cannot receive exactly; a file is never half migrated. A value bound to a name called with keywords "
         "only migrates (AMP401: `(lambda **kwargs: torch.amp.autocast(\"cuda\", **kwargs))`).",
         "amp_autocast = torch.cuda.amp.autocast if args.amp else contextlib.nullcontext\nwith amp_autocast(args.amp):",
         MANUAL),
    Rule("AMP411", "warning", "apex amp not migrated to torch.amp (a run-time opt_level without a literal default, O3, a flag that also switches other code, other apex APIs, or the native conversion would be incomplete); the file stays on apex",
         "torch.amp has one mixed precision mode (apex's O1) and no switch the migration could tie to apex's own; "
         "a file is never half migrated.",
         "model, optimizer = amp.initialize(model, optimizer, opt_level=args.opt_level)", MANUAL),
    Rule("AMP412", "warning", "apex O0 (float32) migrated to torch.amp with `enabled=False`: the script still trains in float32",
         "O0 is apex's float32 mode; the migration keeps that behaviour without apex, so the file is 'changed, "
         "incomplete' until enabled=True turns mixed precision on.",
         'amp.initialize(model, optimizer, opt_level="O0")\n  -> torch.autocast(device_type="cuda", dtype=torch.float16, '
         'enabled=False)', MANUAL, incomplete=True),
]

BY_CODE: Dict[str, Rule] = {rule.code: rule for rule in RULES}

#: warnings that, on a changed file, mean the change cannot take full effect
INCOMPLETE_CONVERSION_CODES = frozenset(rule.code for rule in RULES if rule.incomplete)


def rule(code: str) -> Optional[Rule]:
    return BY_CODE.get(code.upper())


def readme_table() -> str:
    """The README's rule table, generated from the catalogue."""
    rows = ["| code | meaning |", "| --- | --- |"]
    rows += [f"| {r.code} | {r.summary} |" for r in RULES]
    return "\n".join(rows)


def render_list() -> str:
    """`ampify rules`: one line per rule."""
    return "\n".join(f"{r.code}  {r.target:<12}  {r.severity:<15}  {_plain(r.summary)}" for r in RULES)


def render_rule(found: Rule) -> str:
    """`ampify rule CODE`: what, why, an example and how far the fix can be trusted (as `ruff rule`)."""
    fix = {
        SAFE: "ampify rewrites it; the rewrite is exact",
        REVIEW: "ampify rewrites it; read the diff (placement, device, a moved statement)",
        MANUAL: "ampify leaves the code as it is: the finding says what to do by hand",
    }[found.fix]
    lines = [
        f"{found.code} ({found.target}, {found.severity})",
        "",
        _plain(found.summary),
        "",
        "Why: " + found.why,
        "",
        "Example:",
        *("    " + line for line in found.example.splitlines()),
        "",
        "Fix: " + fix,
    ]
    if found.incomplete:
        lines.append("On a changed file this warning makes the file 'changed, incomplete' (exit 1).")
    return "\n".join(lines)


def _plain(markdown: str) -> str:
    return markdown.replace("`", "")


class UnknownRule(ValueError):
    """A --select/--ignore entry that is no code and no prefix of one."""


@dataclass(frozen=True)
class Selection:
    """Which findings are reported: `select` prefixes (empty: all), minus `ignore` prefixes."""

    select: Sequence[str] = ()
    ignore: Sequence[str] = ()

    @classmethod
    def from_lists(cls, select: Iterable[str], ignore: Iterable[str]) -> "Selection":
        """Validated, upper-cased; raises UnknownRule naming the entry that matches no code."""
        cleaned = []
        for group in (select, ignore):
            entries = []
            for entry in group:
                prefix = entry.strip().upper()
                if not prefix or not any(code.startswith(prefix) for code in BY_CODE):
                    raise UnknownRule(f"{entry!r} is no rule code or prefix of one (see `ampify rules`)")
                entries.append(prefix)
            cleaned.append(tuple(entries))
        return cls(*cleaned)

    def allows(self, code: str) -> bool:
        if self.select and not any(code.startswith(prefix) for prefix in self.select):
            return False
        return not any(code.startswith(prefix) for prefix in self.ignore)

    @property
    def everything(self) -> bool:
        return not self.select and not self.ignore
