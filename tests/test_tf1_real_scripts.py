"""Patterns from real public TF1 training scripts that once fooled the transform."""

from ampify.convert import convert_source
from ampify.findings import FileStatus


def _codes(conversion, code):
    return [f.line for f in conversion.findings if f.code == code]


def test_a_name_shared_with_a_local_accumulating_wrapper_does_not_block_wrapping():
    # nshepperd/gpt-2 train.py: `opt` is an AccumulatingOptimizer in one branch (whose reset()
    # is read), a plain Adam optimizer in the other; both Adam optimizers must be wrapped.
    source = (
        "import tensorflow as tf\n"
        "class AccumulatingOptimizer(object):\n"
        "    def __init__(self, opt, var_list):\n"
        "        self.opt = opt\n"
        "    def reset(self):\n"
        "        return tf.no_op()\n"
        "def build(loss, train_vars, accumulate):\n"
        "    if accumulate:\n"
        "        opt = AccumulatingOptimizer(opt=tf.train.AdamOptimizer(1e-3), var_list=train_vars)\n"
        "        reset = opt.reset()\n"
        "    else:\n"
        "        opt = tf.train.AdamOptimizer(1e-3)\n"
        "    return opt\n"
    )
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED
    assert _codes(conversion, "AMP101") == [9, 12]
    assert _codes(conversion, "AMP119") == []


def test_an_optimizer_whose_private_attribute_is_read_is_reported_not_wrapped():
    source = (
        "import tensorflow as tf\n"
        "optimizer = None\n"
        "optimizer = tf.train.MomentumOptimizer(0.1, 0.9)\n"
        "train_op = optimizer.minimize(loss)\n"
        "tf.summary.scalar('lr', optimizer._learning_rate)\n"
    )
    conversion = convert_source(source)
    assert conversion.status is FileStatus.UNCONVERTED
    assert _codes(conversion, "AMP119") == [3]
    assert "_learning_rate (line 5)" in conversion.findings[0].message


def test_tape_gradients_reaching_apply_gradients_are_warned_at_the_tape_call():
    source = (
        "import tensorflow as tf\n"
        "tf.enable_eager_execution()\n"
        "opt = tf.train.AdamOptimizer(1e-3)\n"
        "with tf.GradientTape() as tape:\n"
        "    loss = model(x)\n"
        "grads = tape.gradient(loss, model.variables)\n"
        "opt.apply_gradients(zip(grads, model.variables))\n"
    )
    conversion = convert_source(source)
    warnings = [(f.code, f.line) for f in conversion.findings if f.severity.name == "WARNING"]
    assert warnings == [("AMP120", 2), ("AMP115", 6)]  # eager: no graph, no float16
    assert any("tape.gradient(...)" in f.message for f in conversion.findings if f.code == "AMP115")


def _optimizer_after_gradients(between: str, optimizer: str = "opt = tf.train.AdamOptimizer(self.lr)") -> str:
    return (
        "import tensorflow as tf\n"
        "class A(object):\n"
        "    def build(self, loss, params):\n"
        "        grads = tf.gradients(loss, params)\n"
        f"        {between}\n"
        f"        {optimizer}\n"
        "        return opt.apply_gradients(zip(grads, params))\n"
    )


def test_optimizer_moves_above_tf_gradients_only_when_nothing_between_changes_it():
    moved = convert_source(_optimizer_after_gradients("grads, _ = tf.clip_by_global_norm(grads, 5.0)"))
    assert _codes(moved, "AMP103") == [4] and _codes(moved, "AMP110") == []
    lines = [line.strip() for line in moved.converted.splitlines()]
    start = lines.index("def build(self, loss, params):")
    assert lines[start + 1].startswith("opt = tf.compat.v1.train.experimental.")
    assert lines[start + 2] == "grads = [g for g, _ in opt.compute_gradients(loss, var_list=params)]"

    for between, why in [
        ("self.lr = self.lr * 2", "sets self.lr"),
        ("self.update_lr()", "calls methods of self"),
        ("print(opt)", "already uses opt"),
    ]:
        kept = convert_source(_optimizer_after_gradients(between))
        assert _codes(kept, "AMP103") == [], between
        warning = [f for f in kept.findings if f.code == "AMP110"]
        assert len(warning) == 1 and why in warning[0].message, (between, warning)
        assert "tf.gradients(loss, params)" in kept.converted


def test_an_optimizer_assigned_twice_is_not_moved():
    source = _optimizer_after_gradients(
        "opt = None", optimizer="opt = tf.train.AdamOptimizer(0.1)"
    )
    conversion = convert_source(source)
    assert _codes(conversion, "AMP103") == []
    assert "tf.gradients(loss, params)" in conversion.converted


def test_session_getters_warn_but_clearing_or_setting_a_session_does_not():
    source = (
        "import tensorflow as tf\n"
        "from keras import backend as K\n"
        "K.clear_session()\n"
        "K.set_session(config)\n"
        "sess = K.get_session()\n"
        "train_op = tf.train.AdamOptimizer(1e-3).minimize(loss)\n"
    )
    conversion = convert_source(source)
    assert _codes(conversion, "AMP113") == [5]
    assert any("K.get_session() hands out a Session" in f.message for f in conversion.findings)


def test_an_attribute_optimizer_moves_above_tf_gradients_that_reads_other_attributes():
    source = (
        "import tensorflow as tf\n"
        "class Agent(object):\n"
        "    def build(self, params):\n"
        "        grads = tf.gradients(self.loss, params)\n"
        "        self.trainer = tf.train.AdamOptimizer(1e-3)\n"
        "        self.train_op = self.trainer.apply_gradients(zip(grads, params))\n"
    )
    conversion = convert_source(source)
    assert _codes(conversion, "AMP103") == [4] and _codes(conversion, "AMP110") == []
    text = conversion.converted
    assert text.index("self.trainer = ") < text.index("self.trainer.compute_gradients(self.loss")
