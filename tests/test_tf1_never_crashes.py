"""The TF1 transform never raises and never emits code that does not compile, on odd code.

Two generators: hypothesmith's arbitrary Python (does the transform survive any syntax?) and
random compositions of TF1 training fragments in odd contexts (nesting, star-args, walrus,
decorators, lambdas, class bodies), which reach every rule.
"""

from __future__ import annotations

import libcst as cst
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ampify.options import Options
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.tf1.graph_rewrite import TF1GraphRewrite

try:
    import hypothesmith
except ImportError:  # pragma: no cover - listed in the test extras
    hypothesmith = None

TF1_PREFIX = "import tensorflow as tf\nsess = tf.Session()\n"

FRAGMENTS = [
    "opt = tf.train.AdamOptimizer(lr)",
    "op = tf.train.AdamOptimizer(lr).minimize(loss)",
    "grads = tf.gradients(loss, tvars)",
    "grads = tf.gradients(*args)",
    "grads = tf.gradients(ys=loss, xs=tvars, stop_gradients=s)",
    "(grads, _) = tf.clip_by_global_norm(grads, 1.0)",
    "train_op = opt.apply_gradients(zip(grads, tvars))",
    "train_op = opt.apply_gradients(*pairs)",
    "get().apply_gradients(zip(tf.gradients(loss, v), v))",
    "x[0].apply_gradients(grads)",
    "out.append(g)",
    "cls = tf.train.AdamOptimizer if f else tf.keras.optimizers.Adam",
    "o = cls(lr)",
    "o = {'a': tf.train.AdamOptimizer}[k](lr)",
    "o = getattr(tf.train, name)(lr)",
    "o = getattr(tf.keras.optimizers, name)(lr)",
    "o = functools.partial(tf.train.MomentumOptimizer, momentum=0.9)(lr)",
    "o = tf.keras.optimizers.SGD()",
    "o = tf.train.experimental.enable_mixed_precision_graph_rewrite(o)",
    "(n := tf.gradients(loss, v))",
    "o = foo.BarOptimizer(1)",
    "t = tf.contrib.layers.optimize_loss(loss, g, 0.1, 'Adam')",
    "t = tf.estimator.DNNClassifier(optimizer=tf.train.AdamOptimizer)",
    "s = tf.InteractiveSession()",
    "import tensorflow.compat.v1 as tf",
    "from tensorflow.train import AdamOptimizer as tf",
    "tf = None",
    "o = tf.train.AdamOptimizer(lambda: tf.gradients(loss, v))",
    "o = tf.train.Optimizer(False, 'x')",
    "del grads",
    "global opt",
    "print(*tf.gradients(loss, v), **kw)",
    "grads[0] = tf.gradients(l, v)[0]",
    "opt: tf.train.Optimizer = tf.train.RMSPropOptimizer(0.1)",
]
WRAPPERS = [
    "{body}",
    "def f(loss, lr=tf.train.AdamOptimizer, *a, **k):\n{indented}",
    "for i in range(2):\n{indented}",
    "with tf.Session() as sess:\n{indented}",
    "class C(tf.train.Optimizer):\n{indented}",
    "if x:\n{indented}\nelse:\n{indented}",
    "async def g():\n{indented}",
    "@decorator\ndef h(self):\n{indented}",
    "try:\n{indented}\nexcept Exception:\n    pass",
    "while True:\n{indented}\n    break",
]


@st.composite
def tf1_programs(draw):
    pieces = []
    for _ in range(draw(st.integers(1, 6))):
        body = "\n".join(draw(st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=5)))
        indented = "\n".join("    " + line for line in body.splitlines())
        pieces.append(draw(st.sampled_from(WRAPPERS)).format(body=body, indented=indented))
    prefix = draw(st.sampled_from([TF1_PREFIX, "import tensorflow as tf\n"]))
    return prefix + "\n".join(pieces) + "\n"


def _check(source: str) -> None:
    try:
        module = cst.parse_module(source)
    except Exception:
        return  # not for the transform: the engine reports unparsable files
    result = TF1GraphRewrite().apply(module, ImportMap.from_module(module), Options())
    assert not [f for f in result.findings if f.code == "AMP100"], result.findings
    if result.module.code != source or result.findings:
        # may_apply must never skip a file the transform would change or warn about.
        assert TF1GraphRewrite().may_apply(source.encode("utf-8"), Options())
    try:
        compile(source, "<in>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return
    compile(result.module.code, "<out>", "exec", dont_inherit=True)
    # A second pass over the output never changes it again.
    again = TF1GraphRewrite().apply(result.module, ImportMap.from_module(result.module), Options())
    assert again.module.code == result.module.code


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(tf1_programs())
def test_random_tf1_programs_never_crash_and_compile(source):
    _check(source)


if hypothesmith is not None:

    @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
    @given(hypothesmith.from_grammar())
    def test_arbitrary_python_never_crashes(source):
        _check(TF1_PREFIX + source if not source.lstrip().startswith("from __future__") else source)


def test_an_optimizer_declared_global_again_after_tf_gradients_is_not_used_before_it():
    """Found by the property above: `global opt` repeated after tf.gradients; rewriting it to
    opt.compute_gradients would use opt before its last declaration (the output did not compile)."""
    _check("import tensorflow as tf\nsess = tf.Session()\nglobal opt\ngrads = tf.gradients(loss, tvars)\nglobal opt\n"
           "train_op = opt.apply_gradients(zip(grads, tvars))\n"
           "def f(loss, lr=tf.train.AdamOptimizer, *a, **k):\n    opt = tf.train.AdamOptimizer(lr)\n")
