"""MXNet Gluon probe: `amp.init` and its target dtype, the dtype the network's outputs have while
autograd records, the amp_cast nodes of hybridized graphs, and at the first trainer step whether
the trainer has amp's loss scaler and how many losses were scaled; then stop.

Stdlib only at import time; it touches MXNet only once the script has imported it.
"""
import threading

import _ampify_probe_common as common

_state = {"stopped": False, "patched": False}
_depth = threading.local()
#: outermost block calls recorded (enough to show what the network computes in)
_MAX_OUTPUTS = 8


def _dtype_name(array):
    dtype = getattr(array, "dtype", None)
    if dtype is None:
        return None
    if "bfloat16" in str(getattr(dtype, "names", None) or "") + str(dtype):
        return "bfloat16"
    # MXNet gives numpy scalar types (numpy.float32), numpy gives dtypes
    return getattr(dtype, "name", None) or getattr(dtype, "__name__", None) or str(dtype)


def _first_array(output):
    if isinstance(output, (list, tuple)):
        for item in output:
            found = _first_array(item)
            if found is not None:
                return found
        return None
    return output if hasattr(output, "dtype") else None


def _amp_casts(block):
    """amp_cast nodes in a hybridized block's cached graph (tojson strips them unless told not to)."""
    graph = getattr(block, "_cached_graph", None)
    if not graph:
        return None
    try:
        text = graph[1].tojson(remove_amp_cast=False)
    except Exception:
        return None
    return text.count('"amp_cast"') + text.count('"amp_multicast"')


def _install_bench_timing(mxnet, evidence):
    """`ampify bench`: a timestamp after every trainer step (once MXNet's engine finished its
    work), the mean loss of every measured step, peak host memory; the script stops after
    WARMUP + STEPS steps."""
    import time

    from mxnet import autograd, gluon
    from mxnet.contrib import amp

    warmup, steps = common.bench_steps()
    times = evidence.setdefault("step_times", [])
    losses = evidence.setdefault("losses", [])
    pending = {"scaled": False}

    def record_loss(loss):
        if len(times) < warmup or len(losses) >= steps:
            return
        try:
            with autograd.pause():
                values = [float(item.mean().asscalar()) for item in (loss if isinstance(loss, (list, tuple)) else [loss])]
            losses.append(sum(values) / len(values))
        except Exception:
            pass

    def make_scale_loss(original):
        def scale_loss(loss, *args, **kwargs):
            record_loss(loss)
            pending["scaled"] = True  # the backward that follows is of the scaled loss
            return original(loss, *args, **kwargs)
        return scale_loss

    def note_backward(heads):
        if pending["scaled"]:
            pending["scaled"] = False
        else:
            record_loss(heads)

    def make_method_backward(original):
        def backward(self, *args, **kwargs):
            note_backward(self)
            return original(self, *args, **kwargs)
        return backward

    def make_function_backward(original):
        def backward(heads, *args, **kwargs):
            note_backward(heads)
            return original(heads, *args, **kwargs)
        return backward

    def make_step(original):
        def step(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if common.in_verified_process():
                mxnet.nd.waitall()
                times.append(time.perf_counter())
                if len(times) == warmup + 1 and args and isinstance(args[0], int):
                    evidence["batch_size"] = args[0]  # trainer.step(batch_size) normalises by it
                if len(times) >= warmup + steps:
                    evidence["cuda"] = False
                    common.record_peak_host_memory(evidence)
                    common.stop_script("bench: %d steps timed" % steps)
            return result
        return step

    common.patch_method(amp, "scale_loss", make_scale_loss)
    common.patch_method(mxnet.nd.NDArray, "backward", make_method_backward)
    common.patch_method(autograd, "backward", make_function_backward)
    for name in ("step", "update"):
        common.patch_method(gluon.Trainer, name, make_step)


def on_mxnet_imported(mxnet):
    if _state["patched"]:
        return
    _state["patched"] = True
    evidence = common.section("gluon")
    evidence["version"] = str(getattr(mxnet, "__version__", "?"))
    evidence.setdefault("outputs", [])
    evidence.setdefault("scale_loss_calls", 0)
    try:
        from mxnet import autograd, gluon
        from mxnet.contrib import amp
    except Exception as error:
        evidence.setdefault("probe_errors", []).append(repr(error))
        return
    if common.bench_steps() is not None:
        try:
            _install_bench_timing(mxnet, evidence)
        except Exception as error:
            evidence.setdefault("probe_errors", []).append(repr(error))
        return

    def make_init(original):
        def init(*args, **kwargs):
            target = kwargs.get("target_dtype", args[0] if args else "float16")
            evidence["amp_init"] = {"target_dtype": "bfloat16" if "bfloat16" in str(target) else str(target),
                                    "outputs_before": len(evidence["outputs"])}
            return original(*args, **kwargs)
        return init

    def make_scale_loss(original):
        def scale_loss(*args, **kwargs):
            evidence["scale_loss_calls"] = evidence.get("scale_loss_calls", 0) + 1
            return original(*args, **kwargs)
        return scale_loss

    def make_call(original):
        def __call__(self, *args, **kwargs):
            depth = getattr(_depth, "value", 0)
            _depth.value = depth + 1
            try:
                output = original(self, *args, **kwargs)
            finally:
                _depth.value = depth
            if depth == 0 and common.in_verified_process() and len(evidence["outputs"]) < _MAX_OUTPUTS \
                    and not isinstance(self, gluon.loss.Loss):
                try:
                    if autograd.is_recording():
                        array = _first_array(output)
                        if array is not None:
                            evidence["outputs"].append([type(self).__name__, _dtype_name(array), _amp_casts(self)])
                except Exception as error:
                    evidence.setdefault("probe_errors", []).append(repr(error))
            return output
        return __call__

    def make_step(original):
        def step(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            if not _state["stopped"] and common.in_verified_process():
                _state["stopped"] = True
                scaler = getattr(self, "_amp_loss_scaler", None)
                evidence["steps"] = 1
                evidence["loss_scaler"] = scaler is not None
                evidence["loss_scale"] = getattr(scaler, "loss_scale", None)
                evidence["update_on_kvstore"] = getattr(self, "_update_on_kvstore", None)
                common.stop_when_allowed("gluon trainer step")
            return result
        return step

    try:
        common.patch_method(amp, "init", make_init)
        common.patch_method(amp, "scale_loss", make_scale_loss)
        common.patch_method(gluon.Block, "__call__", make_call)
        for name in ("step", "update"):
            common.patch_method(gluon.Trainer, name, make_step)
    except Exception as error:  # an MXNet without one of these: say so, never break the script
        evidence.setdefault("probe_errors", []).append(repr(error))


def install():
    common.hooks.watch("mxnet", on_mxnet_imported)
