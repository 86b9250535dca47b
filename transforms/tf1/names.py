"""Data tables for the TF1 graph rewrite: which TensorFlow names are what.

Every name here is fully qualified and normalised: `tensorflow.compat.v1.X` is written
`tensorflow.X` (see `normalise_tf_name`). Logic lives in the tf1_* modules; this file is data.
"""

from __future__ import annotations

from typing import Optional

#: Known TF1 optimizer classes (`tf.train.*`, `tf.contrib.opt.*`). Any other
#: `tensorflow.train.*Optimizer` / `tensorflow.contrib.**.*Optimizer` is an optimizer too
#: (see `is_tf1_optimizer_class`); this table documents the common ones and covers classes
#: whose name would not match the general rule.
TF1_OPTIMIZER_CLASSES = frozenset(
    "tensorflow.train." + name
    for name in (
        "GradientDescentOptimizer",
        "AdamOptimizer",
        "AdagradOptimizer",
        "AdagradDAOptimizer",
        "AdadeltaOptimizer",
        "MomentumOptimizer",
        "RMSPropOptimizer",
        "FtrlOptimizer",
        "ProximalGradientDescentOptimizer",
        "ProximalAdagradOptimizer",
    )
) | frozenset(
    "tensorflow.contrib.opt." + name
    for name in (
        "AdamWOptimizer",
        "LazyAdamOptimizer",
        "MomentumWOptimizer",
        "NadamOptimizer",
        "PowerSignOptimizer",
        "AddSignOptimizer",
        "AdaMaxOptimizer",
        "GGTOptimizer",
        "ShampooOptimizer",
        "RegAdagradOptimizer",
        "LARSOptimizer",
    )
)

#: Optimizers that wrap another optimizer: never wrapped themselves (the inner optimizer is
#: wrapped where it is built; wrapping both would scale the loss twice).
TF1_WRAPPING_OPTIMIZERS = frozenset(
    {
        "tensorflow.train.Optimizer",  # the abstract base class
        "tensorflow.train.SyncReplicasOptimizer",
        "tensorflow.contrib.opt.MovingAverageOptimizer",
        "tensorflow.contrib.opt.ModelAverageOptimizer",
        "tensorflow.contrib.opt.DropStaleGradientOptimizer",
        "tensorflow.contrib.opt.ElasticAverageOptimizer",
        "tensorflow.contrib.opt.AGNOptimizer",
        "tensorflow.contrib.opt.VariableClippingOptimizer",
        "tensorflow.contrib.opt.MultitaskOptimizerWrapper",
        "tensorflow.contrib.estimator.TowerOptimizer",
        "tensorflow.contrib.tpu.CrossShardOptimizer",
        "tensorflow.tpu.CrossShardOptimizer",
        "tensorflow.contrib.mixed_precision.LossScaleOptimizer",
        "tensorflow.train.experimental.MixedPrecisionLossScaleOptimizer",
    }
)

#: Module prefixes under which a `*Optimizer` name is a TF1 optimizer class.
TF1_OPTIMIZER_MODULE_PREFIXES = ("tensorflow.train.", "tensorflow.contrib.")

#: Keras optimizers: enable_mixed_precision_graph_rewrite refuses them in current TF.
KERAS_OPTIMIZER_PREFIXES = (
    "tensorflow.keras.optimizers.",
    "tensorflow.optimizers.",
    "tensorflow.python.keras.optimizer_v2.",
    "tensorflow.contrib.keras.optimizers.",
    "keras.optimizers.",
    "tf_keras.optimizers.",
)

#: Callees named `*Optimizer` from these packages are not unknown optimizers to warn about:
#: TensorFlow's own (classified above) and distributed wrappers that wrap an inner optimizer.
NOT_FOREIGN_OPTIMIZER_MODULES = ("tensorflow", "keras", "tf_keras", "horovod", "byteps")

#: Modules whose attributes are looked up by `getattr(module, name)(lr)` to pick an optimizer.
TF1_OPTIMIZER_MODULES = frozenset({"tensorflow.train", "tensorflow.contrib.opt"})

#: Calls that return a new TF1 optimizer class, e.g. contrib's decoupled weight decay factory.
TF1_OPTIMIZER_CLASS_FACTORIES = frozenset(
    {"tensorflow.contrib.opt.extend_with_decoupled_weight_decay"}
)

#: Dicts of TF1 optimizer classes by name: `OPTIMIZER_CLS_NAMES[name](lr)` builds a TF1 optimizer.
TF1_OPTIMIZER_CLASS_TABLES = frozenset(
    {
        "tensorflow.contrib.layers.OPTIMIZER_CLS_NAMES",
        "tensorflow.contrib.layers.python.layers.optimizers.OPTIMIZER_CLS_NAMES",
    }
)

#: The graph rewrite wrapper, by the attribute path that reaches it from each importable module.
#: Order is preference: the first module the script binds at module level is used.
WRAPPER_PATH_FROM_MODULE = (
    ("tensorflow", "compat.v1.train.experimental.enable_mixed_precision_graph_rewrite"),
    ("tensorflow.compat.v1", "train.experimental.enable_mixed_precision_graph_rewrite"),
    ("tensorflow.compat", "v1.train.experimental.enable_mixed_precision_graph_rewrite"),
    ("tensorflow.compat.v1.train", "experimental.enable_mixed_precision_graph_rewrite"),
)
WRAPPER_FUNCTION = "enable_mixed_precision_graph_rewrite"

#: The environment variable that stops pre-Volta GPUs from silently skipping the rewrite.
IGNORE_PERFORMANCE_ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE"

#: The variables that take Sigmoid off the rewrite's infer list (TF >= 2.4 calls it INFERLIST, TF 1.14-2.3
#: GRAYLIST; each reads its own): an op on no list stays float32, so a sigmoid's probability whose log the
#: loss takes (`tf.log(1 - D_fake + 1e-8)`) does not round to 1 in float16 (AMP106).
SIGMOID_IN_FLOAT32_ENV = (
    ("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_INFERLIST_REMOVE", "Sigmoid"),
    ("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_GRAYLIST_REMOVE", "Sigmoid"),
)

#: The variables that take the matrix products off the rewrite's allow list (TF >= 2.4: ALLOWLIST, TF
#: 1.14-2.3: WHITELIST): a Gram matrix (style transfer's `tf.matmul(feats_T, feats)`) sums h*w products,
#: beyond float16's 65504 before its division by the size; kept float32 (AMP107).
MATMUL_OPS = "MatMul,BatchMatMul,BatchMatMulV2,BatchMatMulV3,Einsum"
MATMUL_IN_FLOAT32_ENV = (
    ("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_ALLOWLIST_REMOVE", MATMUL_OPS),
    ("TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_WHITELIST_REMOVE", MATMUL_OPS),
)

#: Optimizers the graph rewrite's loss scaling cannot wrap: a Session asking for the rewrite in its
#: config would run them in float16 without it (cysmith/neural-style-tf's default L-BFGS path).
UNSCALED_OPTIMIZERS = frozenset({"ScipyOptimizerInterface", "ExternalOptimizerInterface", "lbfgs_minimize",
                                 "bfgs_minimize"})

#: Bytes of which a file must contain one (besides b"tensorflow") for the transform to parse it.
#: Each rule needs one of them: an optimizer class or instance (`Optimizer`, `optimizer`,
#: Keras `optimizers`), a class fetched from the train/contrib module (`.train`, `train import`,
#: `contrib`), apply_gradients, a Session, a mixed precision API, optimize_loss, a canned
#: Estimator (`Classifier`, `Regressor`), or TF2 training (`GradientTape`, `.fit(`).
MAY_APPLY_MARKERS = (
    b"ptimizer",
    b".train",
    b"train import",
    b"contrib",
    b"apply_gradients",
    b"Session",
    b"mixed_precision",
    b"LossScale",
    b"mixed_float16",
    b"mixed_bfloat16",
    b"TF_ENABLE_AUTO_MIXED_PRECISION",
    b"optimize_loss",
    b"Classifier",
    b"Regressor",
    b"GradientTape",
    b".fit(",
)

#: Identifiers (last attribute or bare name) that mean a file already uses mixed precision.
MIXED_PRECISION_IDENTIFIERS = frozenset(
    {
        WRAPPER_FUNCTION,
        "MixedPrecisionLossScaleOptimizer",
        "LossScaleOptimizer",
        "LossScaleOptimizerV1",
        "auto_mixed_precision",
        "auto_mixed_precision_mkl",
        "auto_mixed_precision_cpu",
        "auto_mixed_precision_onednn_bfloat16",
    }
)
#: Functions that count as mixed precision only when reached through a `mixed_precision` module.
MIXED_PRECISION_POLICY_FUNCTIONS = frozenset({"set_global_policy", "set_policy", "Policy"})
#: String literals that mean mixed precision is already configured (Keras policies, NGC env vars).
MIXED_PRECISION_STRINGS = frozenset(
    {
        "mixed_float16",
        "mixed_bfloat16",
        "TF_ENABLE_AUTO_MIXED_PRECISION",
        "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE",
    }
)
#: Of those, the NVIDIA NGC env vars: NGC's TensorFlow wraps optimizers itself, so an
#: unwrapped optimizer in such a file is not worth a warning.
NGC_AUTO_MIXED_PRECISION_STRINGS = frozenset(
    {"TF_ENABLE_AUTO_MIXED_PRECISION", "TF_ENABLE_AUTO_MIXED_PRECISION_GRAPH_REWRITE"}
)

#: Calls that create a Session (normalised names).
SESSION_CONSTRUCTORS = frozenset(
    {
        "tensorflow.Session",
        "tensorflow.InteractiveSession",
        "tensorflow.train.MonitoredTrainingSession",
        "tensorflow.train.MonitoredSession",
        "tensorflow.train.SingularMonitoredSession",
    }
)

#: What MixedPrecisionLossScaleOptimizer (the graph rewrite's wrapper) exposes: any other
#: attribute read on a wrapped optimizer (`opt._lr`, K-FAC's `opt.cov_update_op`) raises
#: AttributeError, because the wrapper does not forward attributes to the inner optimizer.
WRAPPER_FORWARDED_ATTRIBUTES = frozenset(
    {
        "compute_gradients",
        "apply_gradients",
        "minimize",
        "get_slot",
        "get_slot_names",
        "variables",
        "get_name",
        "GATE_NONE",
        "GATE_OP",
        "GATE_GRAPH",
    }
)

#: TensorFlow functions that hand back an existing (or new) Session; other callees named
#: `*session` (baselines' `get_session()`, `sv.managed_session()`) are matched by name.
SESSION_GETTERS = frozenset(
    {
        "tensorflow.get_default_session",
        "tensorflow.keras.backend.get_session",
        "tensorflow.python.keras.backend.get_session",
        "keras.backend.get_session",
    }
)
#: A callee named `<prefix>..._session` with one of these prefixes does not hand out a Session.
NOT_SESSION_GETTER_PREFIXES = (
    "close", "clear", "reset", "set", "end", "stop", "run", "kill", "save", "restore", "del", "destroy",
)

#: Ops whose `.run()` runs in the default Session (one created somewhere else).
RUN_ON_DEFAULT_SESSION = frozenset(
    {"tensorflow.global_variables_initializer", "tensorflow.initialize_all_variables"}
)

#: `tf.gradients`, normalised.
TF_GRADIENTS = frozenset({"tensorflow.gradients"})
#: tf.gradients keyword -> compute_gradients keyword, for the keywords both understand.
GRADIENTS_TO_COMPUTE_GRADIENTS_KWARGS = {
    "grad_ys": "grad_loss",
    "gate_gradients": "gate_gradients",
    "aggregation_method": "aggregation_method",
    "colocate_gradients_with_ops": "colocate_gradients_with_ops",
}
#: tf.gradients parameters in positional order.
TF_GRADIENTS_POSITIONAL = ("ys", "xs", "grad_ys")

#: Normalised names that mark TF1 graph-mode code (the graph rewrite applies). A name matches
#: when it equals an entry or starts with an entry followed by a dot.
TF1_STYLE_MARKERS = (
    "tensorflow.Session",
    "tensorflow.InteractiveSession",
    "tensorflow.placeholder",
    "tensorflow.placeholder_with_default",
    "tensorflow.Graph",
    "tensorflow.get_default_graph",
    "tensorflow.reset_default_graph",
    "tensorflow.get_variable",
    "tensorflow.variable_scope",
    "tensorflow.global_variables_initializer",
    "tensorflow.initialize_all_variables",
    "tensorflow.trainable_variables",
    "tensorflow.disable_v2_behavior",
    "tensorflow.disable_eager_execution",
    "tensorflow.estimator",
    "tensorflow.contrib",
    "tensorflow.layers",
    "tensorflow.app",
    "tensorflow.train.Optimizer",
    "tensorflow.train.Saver",
    "tensorflow.train.MonitoredTrainingSession",
    "tensorflow.train.MonitoredSession",
    "tensorflow.train.Supervisor",
    "tensorflow.train.get_or_create_global_step",
    "tensorflow.train.get_global_step",
)

#: Callees that may take an optimizer CLASS as an argument without handing it to other code.
CLASS_ARGUMENT_IS_LOCAL = frozenset(
    {
        "isinstance",
        "issubclass",
        "super",
        "functools.partial",
        "getattr",
        "hasattr",
        "setattr",
        "callable",
        "type",
        "id",
        "dir",
        "vars",
        "print",
        "repr",
        "str",
        "format",
    }
)

#: Canned Estimators and helpers that build their optimizer inside TensorFlow.
OPTIMIZER_BUILT_INSIDE_TF = frozenset(
    {
        "tensorflow.contrib.layers.optimize_loss",
        "tensorflow.estimator.DNNClassifier",
        "tensorflow.estimator.DNNRegressor",
        "tensorflow.estimator.LinearClassifier",
        "tensorflow.estimator.LinearRegressor",
        "tensorflow.estimator.DNNLinearCombinedClassifier",
        "tensorflow.estimator.DNNLinearCombinedRegressor",
    }
)


def normalise_tf_name(qualified: Optional[str]) -> Optional[str]:
    """`tensorflow.compat.v1.train.X` -> `tensorflow.train.X`; other names unchanged."""
    if qualified is None:
        return None
    prefix = "tensorflow.compat.v1"
    if qualified == prefix:
        return "tensorflow"
    if qualified.startswith(prefix + "."):
        return "tensorflow." + qualified[len(prefix) + 1 :]
    return qualified


def is_tf1_optimizer_class(name: Optional[str]) -> bool:
    """Is this normalised name a TF1 optimizer class that the graph rewrite can wrap?"""
    if not name or name in TF1_WRAPPING_OPTIMIZERS:
        return False
    if name in TF1_OPTIMIZER_CLASSES:
        return True
    last = name.rsplit(".", 1)[-1]
    return last.endswith("Optimizer") and name.startswith(TF1_OPTIMIZER_MODULE_PREFIXES) and not (
        name.startswith("tensorflow.contrib.keras.")
    )


def is_keras_optimizer(name: Optional[str]) -> bool:
    """Is this name a Keras optimizer (class or factory) that the wrapper refuses?"""
    return bool(name) and name.startswith(KERAS_OPTIMIZER_PREFIXES) and ".schedules" not in name


#: Calls that turn eager execution on in TF1 code. The graph rewrite changes graphs only:
#: "When eager execution is enabled, the mixed precision graph rewrite is only enabled within
#: tf.functions, as outside tf.functions, there is no graph" (its docstring).
EAGER_ENABLERS = frozenset(
    {
        "tensorflow.enable_eager_execution",
        "tensorflow.enable_v2_behavior",
        "tensorflow.contrib.eager.enable_eager_execution",
    }
)

#: Normalised names (or their prefixes) of what builds a graph even with eager execution on:
#: tf.function and defun, an explicit tf.Graph, a Session, an Estimator.
GRAPH_BUILDERS = (
    "tensorflow.function",
    "tensorflow.compat.v2.function",
    "tensorflow.contrib.eager.defun",
    "tensorflow.contrib.eager.function",
    "tensorflow.autograph",
    "tensorflow.Graph",
    "tensorflow.Session",
    "tensorflow.InteractiveSession",
    "tensorflow.train.MonitoredTrainingSession",
    "tensorflow.train.MonitoredSession",
    "tensorflow.train.SingularMonitoredSession",
    "tensorflow.estimator",
    "tensorflow.contrib.estimator",
    "tensorflow.contrib.tpu",
)


def builds_graph(name: Optional[str]) -> bool:
    """Does this normalised name build a graph the rewrite can change, even with eager on?"""
    if not name:
        return False
    return any(name == entry or name.startswith(entry + ".") for entry in GRAPH_BUILDERS)


def is_tf1_style_marker(name: Optional[str]) -> bool:
    """Does this normalised name mark TF1 graph-mode code?"""
    if not name:
        return False
    return any(name == marker or name.startswith(marker + ".") for marker in TF1_STYLE_MARKERS)
