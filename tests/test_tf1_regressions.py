"""TF1 inputs that hypothesis once found breaking the transform, kept as plain tests."""

from ampify.convert import convert_source
from ampify.findings import FileStatus


def test_optimizer_declared_global_after_tf_gradients_is_warned_not_rewritten():
    source = (
        "import tensorflow as tf\n"
        "sess = tf.Session()\n"
        "op = tf.train.AdamOptimizer(lr).minimize(loss)\n"
        "grads[0] = tf.gradients(l, v)[0]\n"
        "global opt\n"
        "train_op = opt.apply_gradients(zip(grads, tvars))\n"
    )
    conversion = convert_source(source)
    assert conversion.status is FileStatus.CHANGED_INCOMPLETE, "gradients left unscaled: not a clean success"
    compile(conversion.converted, "<converted>", "exec")
    assert "tf.gradients(l, v)" in conversion.converted
    warnings = [f for f in conversion.findings if f.code == "AMP110"]
    assert len(warnings) == 1 and warnings[0].line == 4 and "global" in warnings[0].message
