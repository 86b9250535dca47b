"""TF1 probe: sees which Sessions get grappler's mixed precision rewrite and stops after a training step.

On a machine without a GPU grappler's auto_mixed_precision pass does nothing, so for Sessions
created after the script enabled the graph rewrite this probe also switches on the pass's CPU
variant (with real float16, not emulation), which converts the same kind of nodes.
"""
import os

import _ampify_probe_common as common

EMULATE_FP16_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16"


def _fetched_op_names(fetches, names):
    """Collect op names from a Session.run fetch structure (ops, tensors, names, nested containers)."""
    if isinstance(fetches, dict):
        for value in fetches.values():
            _fetched_op_names(value, names)
    elif isinstance(fetches, (list, tuple)):
        for value in fetches:
            _fetched_op_names(value, names)
    elif isinstance(fetches, str):
        names.add(fetches.split(":")[0].lstrip("^"))
    else:
        op = getattr(fetches, "op", None)
        name = getattr(op, "name", None) or getattr(fetches, "name", None)
        if isinstance(name, str):
            names.add(name.split(":")[0])
    return names


def _has_gpu():
    from tensorflow.python.framework import config

    try:
        return bool(config.list_physical_devices("GPU"))
    except Exception:
        return False


def _patch_session(evidence, train_ops, loss_scaled_ops):
    from tensorflow.core.protobuf import config_pb2, rewriter_config_pb2
    from tensorflow.python.client import session as session_lib
    from tensorflow.python.eager import context
    from tensorflow.python.training.experimental import mixed_precision_global_state as amp_state

    base = session_lib.BaseSession
    original_init = base.__init__
    original_run = base.run
    sessions = evidence.setdefault("sessions", [])

    def __init__(self, target="", graph=None, config=None):
        rewrite = bool(amp_state.is_mixed_precision_graph_rewrite_enabled())
        record = {"rewrite_enabled": rewrite, "cpu_emulation": False}
        amp_option = config.graph_options.rewrite_options.auto_mixed_precision if config else 0
        if rewrite and amp_option == rewriter_config_pb2.RewriterConfig.OFF:
            record["rewrite_enabled"] = False
            record["switched_off_by_config"] = True
        elif rewrite:
            gpu = _has_gpu()
            evidence["gpu"] = gpu
            if not gpu:
                try:
                    new_config = config_pb2.ConfigProto()
                    # Session(config=None) uses the eager context's config: keep what it holds.
                    new_config.CopyFrom(config if config is not None else context.context().config)
                    new_config.graph_options.rewrite_options.auto_mixed_precision_cpu = (
                        rewriter_config_pb2.RewriterConfig.ON
                    )
                except (AttributeError, ValueError) as error:  # a TensorFlow without the CPU pass
                    record["cpu_emulation_error"] = repr(error)
                else:
                    os.environ[EMULATE_FP16_ENV] = "0"
                    config = new_config
                    record["cpu_emulation"] = True
        original_init(self, target, graph, config)
        self._ampify_probe_rewrite = record["rewrite_enabled"]
        sessions.append(record)
        common.write_evidence()

    bench = _bench_timing(evidence)

    def run(self, fetches, *args, **kwargs):
        result = original_run(self, fetches, *args, **kwargs)
        fetched = _fetched_op_names(fetches, set()) & train_ops if train_ops else set()
        if fetched and bench is not None:
            bench(result, kwargs.get("feed_dict", args[0] if args else None))
        elif fetched:
            evidence["train_steps"] = evidence.get("train_steps", 0) + 1
            if getattr(self, "_ampify_probe_rewrite", False):
                evidence["train_steps_with_rewrite"] = evidence.get("train_steps_with_rewrite", 0) + 1
                # Loss scaling: the op came from the loss-scale optimizer after its own
                # compute_gradients scaled the loss (tf.gradients fed to its apply_gradients skip it).
                key = "train_steps_loss_scaled" if fetched & loss_scaled_ops else "train_steps_not_loss_scaled"
                evidence[key] = evidence.get(key, 0) + 1
            common.stop_when_allowed("training step")
        return result

    base.__init__ = __init__
    base.run = run


def _bench_timing(evidence):
    """`ampify bench`: a function to call after each Session.run of a training op (it returns once
    the step is computed): it stamps the time and records the loss, the one scalar float the run
    fetched; it stops the script after WARMUP + STEPS steps. None outside bench."""
    if common.bench_steps() is None:
        return None
    import time

    warmup, steps = common.bench_steps()
    times = evidence.setdefault("step_times", [])
    losses = evidence.setdefault("losses", [])

    def scalars(value):
        if isinstance(value, (list, tuple)):
            return [found for item in value for found in scalars(item)]
        if isinstance(value, dict):
            return [found for item in value.values() for found in scalars(item)]
        shape = getattr(value, "shape", None)
        kind = getattr(getattr(value, "dtype", None), "kind", "")
        return [float(value)] if shape == () and kind == "f" else []

    def after_step(result, feed_dict):
        if not common.in_verified_process():
            return
        times.append(time.perf_counter())
        if len(times) == warmup + 1 and isinstance(feed_dict, dict):
            leading = [value.shape[0] for value in feed_dict.values() if len(getattr(value, "shape", ())) >= 1]
            if leading and len(set(leading)) == 1:
                evidence["batch_size"] = int(leading[0])  # every fed array has this many samples
        found = scalars(result)
        if len(times) > warmup and len(found) == 1 and len(losses) < steps:
            losses.append(found[0])
        if len(times) >= warmup + steps:
            common.record_tensorflow_device_memory(evidence)
            common.record_peak_host_memory(evidence)
            common.stop_script("bench: %d steps timed" % steps)

    return after_step


def _all_subclasses(cls):
    found = [cls]
    for subclass in cls.__subclasses__():
        found.extend(_all_subclasses(subclass))
    return found


def _patch_optimizers(evidence, train_ops):
    """Remember every op that apply_gradients/minimize build: running one is a training step.

    Wrappers such as the mixed precision loss-scale optimizer override apply_gradients without
    calling the base method, so every optimizer class's own method is wrapped.
    """
    from tensorflow.python.training import optimizer as optimizer_lib

    def remember_result(method):
        def wrapper(self, *args, **kwargs):
            op = method(self, *args, **kwargs)
            name = getattr(op, "name", None)
            if isinstance(name, str):
                train_ops.add(name.split(":")[0])
            return op

        wrapper._ampify_probe_wrapped = True
        return wrapper

    for cls in _all_subclasses(optimizer_lib.Optimizer):
        for method_name in ("apply_gradients", "minimize"):
            method = cls.__dict__.get(method_name)
            if method is not None and not getattr(method, "_ampify_probe_wrapped", False):
                setattr(cls, method_name, remember_result(method))


def _patch_loss_scale_optimizer(evidence, loss_scaled_ops):
    """Remember the ops of the graph rewrite's loss-scale optimizer whose loss was scaled: its
    apply_gradients after its own compute_gradients ran (minimize does both)."""
    from tensorflow.python.training.experimental import loss_scale_optimizer

    cls = loss_scale_optimizer.MixedPrecisionLossScaleOptimizer
    original_compute = cls.compute_gradients
    original_apply = cls.apply_gradients

    def compute_gradients(self, *args, **kwargs):
        self._ampify_probe_scaled = True
        return original_compute(self, *args, **kwargs)

    def apply_gradients(self, *args, **kwargs):
        op = original_apply(self, *args, **kwargs)
        name = getattr(op, "name", None)
        if isinstance(name, str) and getattr(self, "_ampify_probe_scaled", False):
            loss_scaled_ops.add(name.split(":")[0])
        return op

    cls.compute_gradients = compute_gradients
    cls.apply_gradients = apply_gradients


def on_tensorflow_imported(tensorflow):
    """Patch Session creation/run and optimizers once the script has imported TensorFlow."""
    evidence = common.section("tf1")
    evidence["version"] = getattr(tensorflow, "__version__", "?")
    train_ops = set()
    loss_scaled_ops = set()
    installs = (
        lambda: _patch_session(evidence, train_ops, loss_scaled_ops),
        lambda: _patch_loss_scale_optimizer(evidence, loss_scaled_ops),
        lambda: _patch_optimizers(evidence, train_ops),  # last: it wraps the methods patched above too
    )
    for name, install in zip(("_patch_session", "_patch_loss_scale_optimizer", "_patch_optimizers"), installs):
        try:
            install()
        except Exception as error:
            evidence.setdefault("probe_errors", []).append("%s: %r" % (name, error))


def _show_info_log_while_importing():
    """TF fixes its C++ log level while it is imported: keep INFO on for that moment.

    grappler's "Converted N/M nodes" line is INFO and many scripts set TF_CPP_MIN_LOG_LEVEL to 2
    or 3 before importing TensorFlow. The script's own value is put back right after the import.
    """
    user_level = os.environ.get("TF_CPP_MIN_LOG_LEVEL")
    os.environ["TF_CPP_MIN_LOG_LEVEL"] = "0"
    common.section("tf1")["user_log_level"] = user_level

    def restore():
        if user_level is None:
            os.environ.pop("TF_CPP_MIN_LOG_LEVEL", None)
        else:
            os.environ["TF_CPP_MIN_LOG_LEVEL"] = user_level

    return restore


def install():
    """Watch for the script's (or its modules') import of TensorFlow."""
    common.hooks.watch("tensorflow", on_tensorflow_imported, before=_show_info_log_while_importing)
