"""PyTorch probe: counts matmul/conv/attention ops by output dtype and stops after an optimizer step.

Stdlib only at import time; it touches torch only once the script has imported torch itself.
"""
import warnings

import _ampify_probe_common as common

# Ops whose output dtype shows whether autocast (or apex) engaged. A TorchDispatchMode sees
# them after autocast has cast the inputs, so the output dtype is what really ran.
COUNTED_OPS = frozenset(
    """
    mm addmm bmm baddbmm addbmm addmv mv dot matmul linear _addmm_activation
    convolution _convolution convolution_backward cudnn_convolution cudnn_convolution_transpose
    mkldnn_convolution miopen_convolution _convolution_double_backward
    _scaled_dot_product_flash_attention _scaled_dot_product_flash_attention_backward
    _scaled_dot_product_efficient_attention _scaled_dot_product_efficient_attention_backward
    _scaled_dot_product_cudnn_attention _scaled_dot_product_cudnn_attention_backward
    _scaled_dot_product_flash_attention_for_cpu _scaled_dot_product_flash_attention_for_cpu_backward
    _flash_attention_forward _flash_attention_backward _efficient_attention_forward
    _efficient_attention_backward _scaled_mm
    """.split()
)
REDUCED_DTYPES = ("float16", "bfloat16")


def _tensor_dtypes(output, torch):
    if isinstance(output, torch.Tensor):
        return [str(output.dtype).replace("torch.", "")]
    if isinstance(output, (list, tuple)):
        found = []
        for item in output:
            found.extend(_tensor_dtypes(item, torch))
        return found
    return []


def _output_dtype(output, torch):
    """The dtype an op ran in: reduced precision if any floating output is fp16/bf16."""
    dtypes = _tensor_dtypes(output, torch)
    for dtype in dtypes:
        if dtype in REDUCED_DTYPES:
            return dtype
    return dtypes[0] if dtypes else "none"


def _call_keeping_warning_locations(function, *args, **kwargs):
    """Call a wrapped torch constructor; its warnings still point at the code that called it.

    torch warns with stacklevel=2, which from inside a wrapper would name this probe file.
    """
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function(*args, **kwargs)
    for warning in caught:
        # 1: this helper, 2: the wrapper, 3: whoever constructed the object
        warnings.warn(warning.message, warning.category, stacklevel=3)


def _install_op_counter(torch, evidence):
    from torch.utils._python_dispatch import TorchDispatchMode

    counts = evidence.setdefault("ops", {"forward": {}, "backward": {}})
    by_op = evidence.setdefault("by_op", {})
    current_autograd_node = getattr(torch._C, "_current_autograd_node", lambda: None)

    class _AmpifyOpCounter(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            output = func(*args, **(kwargs or {}))
            try:
                name = func.overloadpacket.__name__
            except AttributeError:
                return output
            if name in COUNTED_OPS:
                in_backward = name.endswith("backward") or current_autograd_node() is not None
                phase = counts["backward" if in_backward else "forward"]
                dtype = _output_dtype(output, torch)
                phase[dtype] = phase.get(dtype, 0) + 1
                key = "%s:%s" % (name, dtype)
                by_op[key] = by_op.get(key, 0) + 1
            return output

    mode = _AmpifyOpCounter()
    mode.__enter__()  # stays active for the whole script; autograd threads inherit it
    evidence["op_counter"] = "active"


def _record_autocast(torch, evidence):
    autocast_class = torch.amp.autocast_mode.autocast
    original_init = autocast_class.__init__
    records = evidence.setdefault("autocast", [])

    def __init__(self, device_type, *args, **kwargs):
        _call_keeping_warning_locations(original_init, self, device_type, *args, **kwargs)
        requested = kwargs.get("enabled", args[1] if len(args) > 1 else True)
        record = {
            "device_type": str(device_type),
            "requested": bool(requested),
            "enabled": bool(getattr(self, "_enabled", requested)),
            "dtype": str(getattr(self, "fast_dtype", "")).replace("torch.", ""),
        }
        if record not in records:
            records.append(record)

    autocast_class.__init__ = __init__


def _record_grad_scaler(torch, evidence):
    records = evidence.setdefault("grad_scaler", [])
    classes = [torch.amp.grad_scaler.GradScaler]
    for scaler_class in classes:
        original_init = scaler_class.__init__

        def __init__(self, *args, __original=original_init, **kwargs):
            _call_keeping_warning_locations(__original, self, *args, **kwargs)
            record = {
                "device": str(getattr(self, "_device", "")),
                "enabled": bool(getattr(self, "_enabled", False)),
                "requested": bool(kwargs.get("enabled", args[5] if len(args) > 5 else True)),
            }
            if record not in records:
                records.append(record)

        scaler_class.__init__ = __init__


def _count_loss_scaling(torch, evidence):
    """How often a GradScaler scaled a loss: float16 training without it is not AMP training
    (its small gradients underflow), even when every op ran in float16."""
    scaler_class = torch.amp.grad_scaler.GradScaler
    original_scale = scaler_class.scale
    evidence["scaler_scale_calls"] = 0

    def scale(self, outputs, *args, **kwargs):
        if getattr(self, "_enabled", False):
            evidence["scaler_scale_calls"] += 1
        return original_scale(self, outputs, *args, **kwargs)

    scaler_class.scale = scale


def _install_step_hook(torch, evidence):
    from torch.optim.optimizer import register_optimizer_step_post_hook

    evidence["optimizer_steps"] = 0

    def after_step(optimizer, args, kwargs):
        evidence["optimizer_steps"] += 1
        common.stop_when_allowed("optimizer step")

    register_optimizer_step_post_hook(after_step)


def _install_bench_timing(torch, evidence):
    """`ampify bench`: a timestamp after every optimizer step (after the device finished its
    work), the loss of every measured step, and peak memory; the script stops after
    WARMUP + STEPS steps. Nothing per op: the op counter would distort the timing."""
    import time

    warmup, steps = common.bench_steps()
    times = evidence.setdefault("step_times", [])
    losses = evidence.setdefault("losses", [])
    cuda = bool(torch.cuda.is_available())
    pending = {"scaled": False}

    def synchronize():
        if cuda:
            torch.cuda.synchronize()

    def record_loss(value):
        if len(times) >= warmup and len(losses) < steps:
            try:
                losses.append(float(value.detach().float()))
            except Exception:
                pass

    original_backward = torch.Tensor.backward

    def backward(self, *args, **kwargs):
        if pending["scaled"]:
            pending["scaled"] = False  # GradScaler.scale recorded the unscaled loss already
        elif self.numel() == 1:
            record_loss(self)
        return original_backward(self, *args, **kwargs)

    torch.Tensor.backward = backward
    scaler_class = torch.amp.grad_scaler.GradScaler
    original_scale = scaler_class.scale

    def scale(self, outputs, *args, **kwargs):
        if isinstance(outputs, torch.Tensor) and outputs.numel() == 1:
            record_loss(outputs)
            pending["scaled"] = True
        return original_scale(self, outputs, *args, **kwargs)

    scaler_class.scale = scale
    from torch.optim.optimizer import register_optimizer_step_post_hook

    loader_class = torch.utils.data.DataLoader
    original_iter = loader_class.__iter__
    iterated = {"batch_size": None}

    def loader_iter(self):
        if isinstance(getattr(self, "batch_size", None), int):
            iterated["batch_size"] = self.batch_size  # the loader the steps draw from, as they start
        return original_iter(self)

    loader_class.__iter__ = loader_iter

    def after_step(optimizer, args, kwargs):
        if not common.in_verified_process():
            return
        synchronize()
        times.append(time.perf_counter())
        if len(times) == warmup + 1 and iterated["batch_size"]:
            evidence["batch_size"] = iterated["batch_size"]
        if len(times) >= warmup + steps:
            evidence["cuda"] = cuda
            if cuda:
                evidence["peak_device_memory"] = int(torch.cuda.max_memory_allocated())
                evidence["device_name"] = torch.cuda.get_device_name()
            common.record_peak_host_memory(evidence)
            common.stop_script("bench: %d steps timed" % steps)

    register_optimizer_step_post_hook(after_step)
    if cuda:
        torch.cuda.reset_peak_memory_stats()


def on_torch_imported(torch):
    """Install the op counter, the autocast/GradScaler recorders and the optimizer-step hook
    (under `ampify bench`, the step timing alone)."""
    evidence = common.section("torch")
    evidence["version"] = getattr(torch, "__version__", "?")
    evidence["cuda_available"] = bool(torch.cuda.is_available())
    installs = (_record_autocast, _record_grad_scaler, _count_loss_scaling, _install_step_hook, _install_op_counter)
    if common.bench_steps() is not None:
        installs = (_install_bench_timing,)
    for install in installs:
        try:
            install(torch, evidence)
        except Exception as error:  # older torch without one of these APIs
            evidence.setdefault("probe_errors", []).append("%s: %r" % (install.__name__, error))


def _loss_scale_of(amp_module, loss_id):
    """The loss scale apex's scaler `loss_id` holds now, or None where apex keeps it elsewhere."""
    try:
        return float(amp_module._amp_state.loss_scalers[loss_id].loss_scale())
    except Exception:
        return None


def on_apex_amp_imported(amp_module):
    """Record that `apex.amp.initialize` returned (O1's banner alone proves nothing) and every
    loss that `amp.scale_loss` scaled: float16 backward passes outside it are unscaled."""
    evidence = common.section("apex")
    evidence["scale_loss_calls"] = 0
    original_initialize = amp_module.initialize

    def initialize(*args, **kwargs):
        result = original_initialize(*args, **kwargs)
        evidence["initialized"] = True
        evidence["opt_level"] = kwargs.get("opt_level", "O1")
        return result

    amp_module.initialize = initialize
    original_scale_loss = getattr(amp_module, "scale_loss", None)
    if original_scale_loss is None:
        return

    def scale_loss(loss, optimizers, loss_id=0, *args, **kwargs):
        # apex's scale_loss is a generator-based context manager: count the entries that run
        manager = original_scale_loss(loss, optimizers, loss_id, *args, **kwargs)
        evidence["scale_loss_calls"] += 1
        scale = _loss_scale_of(amp_module, loss_id)
        if scale is not None:
            evidence["loss_scale"] = scale
        return manager

    amp_module.scale_loss = scale_loss


def install():
    """Watch for torch and apex.amp imports."""
    common.hooks.watch("torch", on_torch_imported)
    common.hooks.watch("apex.amp", on_apex_amp_imported)
