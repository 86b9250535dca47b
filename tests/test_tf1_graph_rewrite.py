"""Unit tests of the TF1 graph rewrite: options, verdicts, reasons, messages, edge cases."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ampify.convert import convert_source
from ampify.findings import FileStatus, Severity
from ampify.options import Options
from ampify.transforms.tf1.graph_rewrite import TF1GraphRewrite
from golden import discover_cases

ENV = "TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_IGNORE_PERFORMANCE"


def convert(source: str, options: Options = None):
    return convert_source(textwrap.dedent(source), options or Options())


def codes(conversion):
    return [f.code for f in conversion.findings]


def test_env_var_can_be_turned_off():
    source = "import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n"
    on = convert(source)
    off = convert(source, Options(tf_ignore_performance=False))
    assert ENV in on.converted and "AMP102" in codes(on)
    assert ENV not in off.converted and "import os" not in off.converted
    assert "AMP102" not in codes(off)
    assert "enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer(0.1))" in off.converted


def test_import_os_not_repeated_when_already_imported_before_tensorflow():
    source = "import os, sys\nimport tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n"
    out = convert(source).converted
    assert out.count("import os") == 1
    assert out.index(ENV) < out.index("import tensorflow")


def test_import_os_added_when_os_is_only_imported_after_tensorflow():
    source = "import tensorflow as tf\nimport os\nopt = tf.train.AdamOptimizer(0.1)\n"
    out = convert(source).converted
    assert out.startswith("import os\nos.environ.setdefault(")


def test_env_var_set_by_hand_is_not_set_again():
    source = (
        "import os\nos.environ['%s'] = '1'\nimport tensorflow as tf\n"
        "opt = tf.train.AdamOptimizer(0.1)\n" % ENV
    )
    conversion = convert(source)
    assert conversion.converted.count(ENV) == 1
    assert "AMP102" not in codes(conversion)


def test_messages_say_what_was_done():
    conversion = convert("import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n")
    messages = [f.message for f in conversion.findings if f.code == "AMP101"]
    assert messages and messages[0].startswith(
        "wrapped tf.train.AdamOptimizer with the mixed precision graph rewrite"
    )
    assert all(f.severity is Severity.INFO for f in conversion.findings)


def test_tf2_file_is_not_applicable_with_a_reason():
    conversion = convert(
        """\
        import tensorflow as tf
        model = tf.keras.Sequential([tf.keras.layers.Dense(1)])
        optimizer = tf.keras.optimizers.Adam(1e-3)
        """
    )
    # (a compile/fit script is the Keras target's: fixtures/keras)
    assert conversion.status is FileStatus.NOT_APPLICABLE
    assert "graph rewrite does not apply" in conversion.reason
    assert "set_global_policy('mixed_float16')" in conversion.reason
    assert conversion.findings == []


def test_already_mixed_precision_reason_names_the_marker_and_line():
    conversion = convert(
        """\
        import tensorflow as tf
        opt = tf.train.AdamOptimizer(0.1)
        opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(opt)
        """
    )
    assert conversion.status is FileStatus.ALREADY_MIXED_PRECISION
    assert "enable_mixed_precision_graph_rewrite at line 3" in conversion.reason
    assert codes(conversion) == []  # `opt` is wrapped later: no AMP114


def test_already_mixed_precision_file_still_warns_about_tf_gradients():
    conversion = convert(
        """\
        import tensorflow as tf
        def step(loss):
            opt = tf.train.experimental.enable_mixed_precision_graph_rewrite(
                tf.train.AdamOptimizer(0.1))
            tvars = tf.trainable_variables()
            grads = tf.gradients(loss, tvars)
            return opt.apply_gradients(zip(grads, tvars))
        """
    )
    assert conversion.status is FileStatus.ALREADY_MIXED_PRECISION
    assert codes(conversion) == ["AMP110"]
    assert conversion.findings[0].line == 6
    assert "without loss scaling" in conversion.findings[0].message


def test_ngc_env_var_is_replaced_by_the_upstream_wrapper():
    """Upstream TensorFlow ignores the NGC switch: the file is float32 code, converted as such."""
    conversion = convert(
        """\
        import os
        os.environ['TF_ENABLE_AUTO_MIXED_PRECISION'] = '1'
        import tensorflow as tf
        opt = tf.train.AdamOptimizer(0.1)
        """
    )
    assert conversion.status is FileStatus.CHANGED
    assert codes(conversion) == ["AMP104", "AMP102", "AMP101"]
    assert "TF_ENABLE_AUTO_MIXED_PRECISION" not in conversion.converted


def test_ngc_env_var_next_to_the_wrapper_stays_already_mixed_precision():
    conversion = convert(
        """\
        import os
        os.environ['TF_ENABLE_AUTO_MIXED_PRECISION'] = '1'
        import tensorflow as tf
        opt = tf.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer(0.1))
        """
    )
    assert conversion.status is FileStatus.ALREADY_MIXED_PRECISION


def test_dict_mixing_keras_and_tf1_classes_is_not_wrapped():
    conversion = convert(
        """\
        import tensorflow as tf
        x = tf.placeholder(tf.float32)
        OPTS = {'adam': tf.train.AdamOptimizer, 'kadam': tf.keras.optimizers.Adam}
        opt = OPTS[name](0.1)
        """
    )
    assert conversion.status is FileStatus.UNCONVERTED
    assert codes(conversion) == ["AMP112"]
    assert "some of the optimizers it chooses are Keras optimizers" in conversion.findings[0].message


def test_keras_learning_rate_schedules_are_not_optimizers():
    conversion = convert(
        """\
        import tensorflow as tf
        lr = tf.keras.optimizers.schedules.ExponentialDecay(0.1, 100, 0.9)
        opt = tf.compat.v1.train.AdamOptimizer(lr)
        """
    )
    assert codes(conversion) == ["AMP102", "AMP101"]


def test_wrapping_optimizers_are_never_wrapped_themselves():
    conversion = convert(
        """\
        import tensorflow as tf
        inner = tf.train.AdamOptimizer(0.1)
        sync = tf.train.SyncReplicasOptimizer(inner, replicas_to_aggregate=2)
        """
    )
    out = conversion.converted
    assert out.count("enable_mixed_precision_graph_rewrite(") == 1
    assert "sync = tf.train.SyncReplicasOptimizer(inner, replicas_to_aggregate=2)" in out


def test_local_subclass_of_a_local_subclass_is_wrapped():
    conversion = convert(
        """\
        import tensorflow as tf
        class Base(tf.train.Optimizer):
            pass
        class Lamb(Base):
            pass
        opt = Lamb(0.1)
        """
    )
    assert "enable_mixed_precision_graph_rewrite(Lamb(0.1))" in conversion.converted


def test_session_created_in_same_function_before_optimizer_gets_the_rewrite_through_its_config():
    conversion = convert(
        """\
        import tensorflow as tf
        def train(loss):
            sess = tf.Session()
            op = tf.train.AdamOptimizer(0.1).minimize(loss)
            sess.run(op)
        def later(loss):
            with tf.Session() as s:
                s.run(loss)
            op = tf.train.AdamOptimizer(0.1).minimize(loss)
            with tf.Session() as s:
                s.run(op)
        """
    )
    warnings = [(f.code, f.line) for f in conversion.findings if f.severity is Severity.WARNING]
    assert warnings == []
    # A finished `with tf.Session()` block before the optimizer does not matter: only line 3's
    # Session is given a config with the rewrite on.
    assert [(f.code, f.line) for f in conversion.findings if f.code == "AMP105"] == [("AMP105", 3)]
    assert conversion.converted.count("rewrite_options.auto_mixed_precision = ") == 1


def test_may_apply_holds_for_every_tf1_fixture_and_rejects_torch():
    transform = TF1GraphRewrite()
    for case in discover_cases("tf1"):
        assert transform.may_apply(case.input_path.read_bytes(), Options()), case.id
    assert not transform.may_apply(b"import torch\nopt = torch.optim.SGD([], 0.1)\n", Options())


def test_class_passed_to_a_local_function_is_wrapped_where_instantiated():
    conversion = convert(
        """\
        import tensorflow as tf
        def build(loss, opt_cls, lr=0.1):
            return opt_cls(lr).minimize(loss)
        def model_fn(loss):
            return build(loss, tf.train.AdamOptimizer)
        """
    )
    assert "enable_mixed_precision_graph_rewrite(opt_cls(lr))" in conversion.converted
    assert "AMP118" not in codes(conversion)


def test_class_handed_to_another_module_is_warned():
    conversion = convert(
        """\
        import tensorflow as tf
        import trainer
        x = tf.placeholder(tf.float32)
        trainer.fit(x, optimizer_cls=tf.train.AdamOptimizer)
        """
    )
    assert conversion.status is FileStatus.UNCONVERTED
    assert [(f.code, f.line) for f in conversion.findings] == [("AMP118", 4)]


def test_class_default_with_or_is_an_optimizer_class():
    conversion = convert(
        """\
        import tensorflow as tf
        def make(lr, optimizer_cls=None):
            optimizer_cls = optimizer_cls or tf.train.AdamOptimizer
            return optimizer_cls(lr)
        """
    )
    assert "enable_mixed_precision_graph_rewrite(optimizer_cls(lr))" in conversion.converted


def test_tf_gradients_alone_in_tf2_code_is_still_not_applicable():
    conversion = convert(
        """\
        import tensorflow as tf
        @tf.function
        def hvp(f, x):
            return tf.gradients(f(x), x)
        """
    )
    assert conversion.status is FileStatus.NOT_APPLICABLE


def test_optimizer_built_where_a_session_from_elsewhere_runs_is_warned():
    conversion = convert(
        """\
        import tensorflow as tf
        class Model(object):
            def __init__(self, sess):
                self.sess = sess
            def train(self, loss):
                op = tf.train.AdamOptimizer(0.1).minimize(loss)
                self.sess.run(op)
        def build_then_run(loss):
            op = tf.train.AdamOptimizer(0.1).minimize(loss)
            with tf.Session() as sess:
                sess.run(op)
        """
    )
    warnings = [f for f in conversion.findings if f.severity is Severity.WARNING]
    assert [(f.code, f.line) for f in warnings] == [("AMP113", 6)]
    assert "self.sess, line 7" in warnings[0].message


def test_may_apply_skips_tensorflow_files_without_training_code():
    model_only = b"import tensorflow as tf\ndef net(x):\n    return tf.nn.relu(tf.matmul(x, x))\n"
    assert not TF1GraphRewrite().may_apply(model_only, Options())
    chosen_by_getattr = b"import tensorflow as tf\nopt = getattr(tf.train, name)(0.1)\n"
    assert TF1GraphRewrite().may_apply(chosen_by_getattr, Options())


def test_gradients_from_a_helper_given_the_optimizer_are_traced():
    # tensorflow/models research/slim train_image_classifier.py
    conversion = convert(
        """\
        import tensorflow as tf
        from deployment import model_deploy
        def main(clones, lr, variables_to_train, global_step):
            optimizer = tf.train.MomentumOptimizer(lr, momentum=0.9)
            total_loss, clones_gradients = model_deploy.optimize_clones(
                clones, optimizer, var_list=variables_to_train)
            return optimizer.apply_gradients(clones_gradients, global_step=global_step)
        def other(clones, optimizer, helper):
            grads = helper.compute(clones)
            return optimizer.apply_gradients(grads)
        """
    )
    assert [(f.code, f.line) for f in conversion.findings if f.severity is Severity.WARNING] == [
        ("AMP115", 10)
    ]


def test_local_optimizer_that_wraps_another_is_not_wrapped_itself():
    conversion = convert(
        """\
        import tensorflow as tf
        class GradientAccumulationOptimizer(tf.train.Optimizer):
            def __init__(self, opt, steps, name="Accumulate"):
                super(GradientAccumulationOptimizer, self).__init__(False, name)
                self._opt = opt
        opt = GradientAccumulationOptimizer(tf.train.AdamOptimizer(0.1), 4)
        """
    )
    out = conversion.converted
    assert out.count("enable_mixed_precision_graph_rewrite(") == 1
    assert "GradientAccumulationOptimizer(tf.compat.v1.train.experimental." in out


DDPG_ACTOR = """\
import tensorflow as tf


def add_grad_to_graph(a, params, a_grads, lr):
    with tf.variable_scope('policy_grads'):
        grads = tf.gradients(ys=a, xs=params, grad_ys=a_grads)
    with {scope} as scope:
        opt = tf.train.AdamOptimizer({lr})
        {apply}
    return train_op
"""


@pytest.mark.parametrize("scope, lr, apply, why", [
    # a scope names ops and variables only: the construction moves above the earlier block
    ("tf.variable_scope('A_train')", "-lr", "train_op = opt.apply_gradients(zip(grads, params))", None),
    ("tf.name_scope('A_train')", "-lr", "train_op = opt.apply_gradients(zip(grads, params))", None),
    # a device places the loss scale's variables: kept where it is
    ("tf.device('/cpu:0')", "-lr", "train_op = opt.apply_gradients(zip(grads, params))", "in different blocks"),
    # the construction reads what the `with` binds
    ("tf.variable_scope('A_train')", "scope.name and lr", "train_op = opt.apply_gradients(zip(grads, params))",
     "bound by the `with`"),
])
def test_an_optimizer_built_in_a_later_scope_block_moves_above_the_gradients(scope, lr, apply, why):
    """MorvanZhou's DDPG actor: tf.gradients in one `with tf.variable_scope(...)`, the optimizer built in
    the next. Out of a variable or name scope the construction moves up; out of anything else, or
    when it reads the `with`'s own name, it stays and AMP110 says why."""
    conversion = convert(DDPG_ACTOR.format(scope=scope, lr=lr, apply=apply))
    messages = [f.message for f in conversion.findings if f.code == "AMP110"]
    if why is None:
        assert messages == []
        assert "grads = [g for g, _ in opt.compute_gradients(a, var_list=params, grad_loss=a_grads)]" \
            in conversion.converted
        body = conversion.converted.split("def add_grad_to_graph", 1)[1]
        assert body.index("opt = tf.compat.v1.train.experimental") < body.index("with tf.variable_scope('policy_grads')")
        compile(conversion.converted, "ddpg.py", "exec")
    else:
        assert len(messages) == 1 and why in messages[0], messages


OWN_SESSION_CLASS = """\
import tensorflow as tf


class Agent:
    def __init__(self, n_features, learning_rate=0.01, sess=None):
        self.lr = learning_rate
        self._build()
        if sess is None:
            self.sess = tf.Session()
        else:
            self.sess = sess

    def _build(self):
        self._net()

    def _net(self):
        self.train_op = tf.train.AdamOptimizer(self.lr).minimize(self.loss)
"""


@pytest.mark.parametrize("call, passes", [
    ("Agent(16)", False),
    ("Agent(16, 0.01)", False),
    ("Agent(16, 0.01, sess=None)", False),
    ("Agent(16, 0.01, my_sess)", True),
    ("Agent(16, sess=my_sess)", True),
    ("Agent(*args)", True),
    ("Agent(16, **options)", True),
])
def test_own_session_fallback_and_the_calls_that_hand_a_session_in(call, passes):
    """own_session.py: __init__ builds the optimizer (through two methods) before creating its own
    Session when `sess` is None; a call hands one in by keyword, third positional, or may through
    *args / **kwargs."""
    from ampify.transforms.tf1.own_session import own_session_fallback, passes_session

    module = cst.parse_module(OWN_SESSION_CLASS)
    fallback = own_session_fallback(module, "Agent", "_net", "sess")
    assert fallback is not None and fallback.position == 2
    assert passes_session(cst.parse_expression(call), fallback) is passes


def test_own_session_created_before_the_optimizer_is_no_fallback():
    from ampify.transforms.tf1.own_session import own_session_fallback

    before = OWN_SESSION_CLASS.replace("        self._build()\n", "").replace(
        "            self.sess = sess\n", "            self.sess = sess\n        self._build()\n")
    assert own_session_fallback(cst.parse_module(before), "Agent", "_net", "sess") is None
    no_default = OWN_SESSION_CLASS.replace("sess=None):", "sess=False):")
    assert own_session_fallback(cst.parse_module(no_default), "Agent", "_net", "sess") is None


@pytest.mark.parametrize("unscaled", [
    'tf.contrib.opt.ScipyOptimizerInterface(loss, method="L-BFGS-B")',
    "tfp.optimizer.lbfgs_minimize(value_and_gradients, initial)",
])
def test_a_session_config_is_not_given_the_rewrite_when_an_unscaled_optimizer_shares_the_module(unscaled):
    """The Session exists before the optimizer (AMP113). Its config would normally ask for the rewrite
    (AMP105), but the module also minimizes with an optimizer the rewrite's loss scaling cannot wrap:
    the config is left alone and the warning says why."""
    source = textwrap.dedent(f'''
        import tensorflow as tf
        import tensorflow_probability as tfp

        def stylize(loss, adam):
            with tf.Session() as sess:
                if adam:
                    step = tf.train.AdamOptimizer(1.0).minimize(loss)
                    sess.run(step)
                else:
                    optimizer = {unscaled}
        ''')
    conversion = convert_source(source, Options(), filename="style.py")
    assert conversion.status is FileStatus.CHANGED_INCOMPLETE, conversion
    warning = next(f for f in conversion.findings if f.code == "AMP113")
    assert "ampify did not set it in its config: the module also minimizes with" in warning.message
    assert "which has no loss scaling" in warning.message
    assert "auto_mixed_precision" not in conversion.converted
    without = convert_source(source.replace(unscaled, "None"), Options(), filename="style.py")
    assert "AMP105" in [f.code for f in without.findings], without.findings


_PLACED = """\
import tensorflow as tf

x = tf.placeholder(tf.float32, [None, 4])
{body}
"""


@pytest.mark.parametrize("body, pinned", [
    # everything under the CPU scope, the training op built in it
    ("with tf.device('/cpu:0'):\n    opt = tf.train.AdamOptimizer(1e-3)\n"
     "    train_op = opt.minimize(tf.reduce_mean(tf.layers.dense(x, 1)))", True),
    # the optimizer pinned, the training op built by a class its block calls (A3C's workers)
    ("class Net:\n    def __init__(self, opt):\n        self.op = opt.minimize(tf.reduce_mean(tf.layers.dense(x, 1)))\n"
     "with tf.device('/cpu:0'):\n    opt = tf.train.AdamOptimizer(1e-3)\n    net = Net(opt)", True),
    # only the optimizer pinned: minimize() at module level places its ops by default (the GPU)
    ("with tf.device('/cpu:0'):\n    opt = tf.train.AdamOptimizer(1e-3)\n"
     "train_op = opt.minimize(tf.reduce_mean(tf.layers.dense(x, 1)))", False),
    # towers on the GPUs (cifar10_multi_gpu): the optimizer on the CPU, the gradients on each GPU
    ("with tf.device('/cpu:0'):\n    opt = tf.train.AdamOptimizer(1e-3)\n    for i in range(2):\n"
     "        with tf.device('/gpu:%d' % i):\n            grads = opt.compute_gradients(tf.reduce_mean(tf.layers.dense(x, 1)))\n"
     "    train_op = opt.apply_gradients(grads)", False),
    # a device that is no literal may be a GPU
    ("with tf.device(device_name):\n    opt = tf.train.AdamOptimizer(1e-3)\n"
     "    train_op = opt.minimize(tf.reduce_mean(tf.layers.dense(x, 1)))", False),
    # the embedding alone pinned (dennybritz's text CNN)
    ("with tf.device('/cpu:0'):\n    emb = tf.Variable(tf.zeros([10, 4]))\nopt = tf.train.AdamOptimizer(1e-3)\n"
     "train_op = opt.minimize(tf.reduce_mean(tf.layers.dense(x, 1)))", False),
])
def test_a_graph_pinned_to_the_cpu_is_changed_incomplete(body, pinned):
    """The rewrite converts only ops placed on a GPU (auto_mixed_precision.cc's IsOnGPU): a graph
    built entirely under tf.device('/cpu:0') keeps every op in float32, which AMP125 says."""
    conversion = convert_source(_PLACED.format(body=body))
    assert "AMP101" in codes(conversion)
    assert ("AMP125" in codes(conversion)) is pinned
    assert conversion.status is (FileStatus.CHANGED_INCOMPLETE if pinned else FileStatus.CHANGED)


OPTIMIZE_LOSS = '''\
import tensorflow.compat.v1 as tf

x = tf.placeholder(tf.float32, [None, 4])
loss = tf.reduce_mean(tf.square(tf.layers.dense(x, 1)))
step = tf.train.get_or_create_global_step()
train_op = tf.contrib.layers.optimize_loss(loss, step, {arguments})
with tf.Session() as sess:
    sess.run(train_op)
'''


@pytest.mark.parametrize("arguments, written", [
    ('0.01, "Adam"', 'lambda lr: WRAP(tf.train.AdamOptimizer(learning_rate=lr))'),
    ('learning_rate=lr, optimizer="Momentum", clip_gradients=5.0',
     'lambda lr: WRAP(tf.train.MomentumOptimizer(lr, momentum=0.9))'),
    ("0.1, optimizer='SGD'", 'lambda lr: WRAP(tf.train.GradientDescentOptimizer(learning_rate=lr))'),
    ("0.1, optimizer=tf.train.RMSPropOptimizer", 'lambda lr: WRAP(tf.train.RMSPropOptimizer(learning_rate=lr))'),
    # optimize_loss would raise on these (no learning rate for a name, a name it does not know): left as written
    ('None, "Adam"', None),
    ('learning_rate=0.1, optimizer="Adadelta"', None),
])
def test_optimize_loss_names_are_spelled_as_the_optimizer_it_builds(arguments, written):
    """optimize_loss builds `OPTIMIZER_CLS_NAMES[name](learning_rate=lr)` (Momentum with momentum=0.9) or
    `cls(learning_rate=lr)` for a class, and calls a callable `optimizer(lr)`: the callable ampify
    writes builds the same optimizer from the same learning rate, wrapped (AMP126); a string it
    would refuse stays, refused with AMP117."""
    conversion = convert(OPTIMIZE_LOSS.format(arguments=arguments))
    codes = [f.code for f in conversion.findings]
    if written is None:
        assert conversion.status is FileStatus.UNCONVERTED and "AMP117" in codes, codes
        return
    assert conversion.status is FileStatus.CHANGED and "AMP126" in codes and "AMP117" not in codes, codes
    wrapper = "tf.train.experimental.enable_mixed_precision_graph_rewrite"
    assert written.replace("WRAP", wrapper) in conversion.converted, conversion.converted
