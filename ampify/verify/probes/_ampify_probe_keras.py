"""Keras probe (Keras 3 and Keras 2 / tf_keras): the dtype policy, the layers' compute dtypes and
the optimizer at the first training step, then stop.

Stdlib only at import time; it touches Keras only once the script has imported it.
"""
import _ampify_probe_common as common

_seen = {"stopped": False}


def _policy_name(keras_module):
    try:
        return str(keras_module.mixed_precision.global_policy().name)
    except Exception:
        return "?"


def _record_model(evidence, model, keras_module):
    layers = []
    for layer in getattr(model, "layers", []) or []:
        try:
            if layer.weights:
                layers.append([str(layer.name), str(layer.compute_dtype)])
        except Exception:
            continue
    evidence["layers"] = layers
    evidence["policy_at_fit"] = _policy_name(keras_module)


#: the ops that do a model's arithmetic, as TensorFlow names them in a traced graph
_COMPUTE_OPS = ("MatMul", "BatchMatMul", "BatchMatMulV2", "BatchMatMulV3", "Conv2D", "Conv3D",
                "DepthwiseConv2dNative", "Conv2DBackpropInput", "Conv2DBackpropFilter")


def _traced_compute_dtypes():
    """{dtype: count} of the matmul/conv ops of the train step being traced (fit's tf.function),
    or None when the step runs eagerly (no graph to read)."""
    try:
        import tensorflow as tf

        graph = tf.compat.v1.get_default_graph()
        if type(graph).__name__ != "FuncGraph":
            return None
        counts = {}
        for op in graph.get_operations():
            if op.type in _COMPUTE_OPS:
                try:
                    dtype = op.get_attr("T").name
                except Exception:
                    dtype = "?"
                counts[dtype] = counts.get(dtype, 0) + 1
        return counts
    except Exception:
        return None


def _on_first_step(evidence, optimizer, keras_module):
    if _seen["stopped"] or not common.in_verified_process():
        return
    _seen["stopped"] = True
    traced = _traced_compute_dtypes()
    if traced is not None:
        evidence["traced_ops"] = traced
    evidence["policy"] = _policy_name(keras_module)
    evidence["optimizer"] = type(optimizer).__name__
    evidence["steps"] = 1
    common.stop_when_allowed("keras optimizer step")


def _install_bench_timing(keras_module, evidence):
    """`ampify bench`: `fit` gets one more callback that stamps the end of every training batch (its
    logs are read, which waits for the step) and records the loss; the script stops after WARMUP +
    STEPS batches. Custom loops are not timed."""
    import time

    warmup, steps = common.bench_steps()
    times = evidence.setdefault("step_times", [])
    losses = evidence.setdefault("losses", [])

    class _BenchTiming(keras_module.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            if not common.in_verified_process():
                return
            loss = (logs or {}).get("loss")
            try:
                loss = float(loss)  # waits for the step's result
            except (TypeError, ValueError):
                loss = None
            times.append(time.perf_counter())
            if len(times) > warmup and loss is not None and len(losses) < steps:
                losses.append(loss)
            if len(times) >= warmup + steps:
                common.record_tensorflow_device_memory(evidence)
                common.record_peak_host_memory(evidence)
                common.stop_script("bench: %d steps timed" % steps)

    def make_fit(original):
        def fit(self, *args, **kwargs):
            if isinstance(kwargs.get("batch_size"), int):
                evidence["batch_size"] = kwargs["batch_size"]
            kwargs["callbacks"] = list(kwargs.get("callbacks") or []) + [_BenchTiming()]
            return original(self, *args, **kwargs)
        return fit

    common.patch_method(keras_module.Model, "fit", make_fit)


def on_keras_imported(keras_module, section):
    evidence = common.section(section)
    evidence["version"] = str(getattr(keras_module, "__version__", "?"))
    if common.bench_steps() is not None:
        try:
            _install_bench_timing(keras_module, evidence)
        except Exception as error:  # a Keras without callbacks: say so, never break the script
            evidence.setdefault("probe_errors", []).append(repr(error))
        return

    def make_fit(original):
        def fit(self, *args, **kwargs):
            _record_model(evidence, self, keras_module)
            return original(self, *args, **kwargs)
        return fit

    def make_apply(original):
        def apply_gradients(self, *args, **kwargs):
            _on_first_step(evidence, self, keras_module)
            return original(self, *args, **kwargs)
        return apply_gradients

    try:
        common.patch_method(keras_module.Model, "fit", make_fit)
        classes = [keras_module.optimizers.Optimizer]
        scaler = getattr(keras_module.mixed_precision, "LossScaleOptimizer", None)
        if scaler is not None:
            classes.insert(0, scaler)  # the outer optimizer's call comes first
        for cls in classes:
            for name in ("apply_gradients", "apply"):
                if name in cls.__dict__ or cls is classes[-1]:
                    common.patch_method(cls, name, make_apply)
    except Exception as error:  # a Keras without one of these: say so, never break the script
        evidence.setdefault("probe_errors", []).append(repr(error))


def install():
    common.hooks.watch("keras", lambda module: on_keras_imported(module, "keras"))
    common.hooks.watch("tf_keras", lambda module: on_keras_imported(module, "keras"))
