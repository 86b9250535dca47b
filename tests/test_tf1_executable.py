"""Executable goldens: TF1 scripts converted by ampify really train with the graph rewrite on.

Each script runs under TensorFlow (CPU) in a subprocess, through a small runner that does on
this CPU machine what TensorFlow does on a GPU: for every Session created after
enable_mixed_precision_graph_rewrite, turn on grappler's auto mixed precision pass (here the
CPU one, `auto_mixed_precision_cpu`). Grappler then logs "Converted N/M nodes to float16",
which is the proof that the rewrite really ran; the unconverted script, under the same runner,
must show no converted nodes. The runner also reports every call of the loss-scale
optimizer's compute_gradients, the only place where the loss is scaled.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ampify.convert import convert_source

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"
)

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "tf1"

RUNNER = '''
import runpy
import sys

import tensorflow as tf
from tensorflow.core.protobuf import rewriter_config_pb2
from tensorflow.python.client import session as session_lib
from tensorflow.python.eager import context
from tensorflow.python.training.experimental import loss_scale_optimizer
from tensorflow.python.training.experimental import mixed_precision_global_state

_original_init = session_lib.BaseSession.__init__


def _init(self, target="", graph=None, config=None):
    # TF turns the GPU AMP pass on for Sessions created after enable_mixed_precision_graph_rewrite;
    # turn the CPU pass on under exactly the same condition.
    # A Session whose config asks for the GPU pass itself (ampify sets it where the caller's Session
    # exists before the wrapper) gets the CPU pass the same way.
    asked = config is not None and config.graph_options.rewrite_options.auto_mixed_precision == (
        rewriter_config_pb2.RewriterConfig.ON
    )
    if mixed_precision_global_state.is_mixed_precision_graph_rewrite_enabled() or asked:
        new_config = tf.compat.v1.ConfigProto()
        new_config.CopyFrom(config if config is not None else context.context().config)
        new_config.graph_options.rewrite_options.auto_mixed_precision_cpu = (
            rewriter_config_pb2.RewriterConfig.ON
        )
        config = new_config
        print("AMPIFY_RUNNER session with graph rewrite", file=sys.stderr, flush=True)
    _original_init(self, target, graph, config)


_original_compute = loss_scale_optimizer.MixedPrecisionLossScaleOptimizer.compute_gradients


def _compute(self, *args, **kwargs):
    print("AMPIFY_RUNNER loss-scale compute_gradients", file=sys.stderr, flush=True)
    return _original_compute(self, *args, **kwargs)


session_lib.BaseSession.__init__ = _init
loss_scale_optimizer.MixedPrecisionLossScaleOptimizer.compute_gradients = _compute

script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
'''

CONVERTED_NODES = re.compile(r"Converted (\d+)/(\d+) nodes to float16")
LOSS_LINE = re.compile(r"^step (\d+) loss ([-+0-9.eEnaif]+)$", re.MULTILINE)


def _run(tmp_path: Path, name: str, source: str, prelude: str = ""):
    script = tmp_path / name
    script.write_text(source)
    runner = tmp_path / "amp_runner.py"
    runner.write_text(RUNNER.replace("script = sys.argv[1]\n", prelude + "\nscript = sys.argv[1]\n"))
    env = dict(os.environ)
    env.update(
        TF_USE_LEGACY_KERAS="1",
        TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="0",
        TF_CPP_MIN_LOG_LEVEL="0",
        CUDA_VISIBLE_DEVICES="",
    )
    result = subprocess.run(
        [sys.executable, str(runner), str(script)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def _losses(stdout: str):
    return [float(value) for _, value in LOSS_LINE.findall(stdout)]


def _converted_nodes(stderr: str) -> int:
    return sum(int(n) for n, _ in CONVERTED_NODES.findall(stderr))


def _assert_trains(losses):
    assert len(losses) == 12, losses
    assert all(value == value and abs(value) != float("inf") for value in losses), losses
    # Dynamic loss scaling may skip the first step(s) on overflow; the loss must still fall.
    assert losses[-1] < 0.5 * losses[0], losses


def _convert(name: str) -> str:
    source = (FIXTURES / f"{name}.in.py").read_text()
    conversion = convert_source(source, filename=name)
    assert conversion.converted is not None, conversion.reason
    return source, conversion


def test_converted_tf1_script_trains_with_the_graph_rewrite_on(tmp_path):
    source, conversion = _convert("exec_train_adam")
    assert "AMP101" in {f.code for f in conversion.findings}

    converted = _run(tmp_path, "converted.py", conversion.converted)
    _assert_trains(_losses(converted.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" in converted.stderr
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in converted.stderr

    original = _run(tmp_path, "original.py", source)
    _assert_trains(_losses(original.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" not in original.stderr
    assert _converted_nodes(original.stderr) == 0, original.stderr[-4000:]


def test_bert_style_tf_gradients_script_trains_with_loss_scaling(tmp_path):
    source, conversion = _convert("exec_bert_style_gradients")
    codes = [f.code for f in conversion.findings]
    assert codes.count("AMP103") == 1, codes
    assert "tf.gradients(" not in conversion.converted
    assert "clip_by_global_norm(grads" in conversion.converted  # the clipping is kept

    converted = _run(tmp_path, "converted.py", conversion.converted)
    _assert_trains(_losses(converted.stdout))
    # The loss-scale optimizer's compute_gradients scaled the loss: without the tf.gradients
    # rewrite it would never be called, and fp16 gradients would underflow silently.
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in converted.stderr
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]


def test_wrapper_only_bert_script_would_skip_loss_scaling(tmp_path):
    """The trap the tf.gradients rewrite exists for: wrapping alone never scales the loss."""
    source, conversion = _convert("exec_bert_style_gradients")
    wrapped_only = conversion.converted.replace(
        "[g for g, _ in optimizer.compute_gradients(loss, var_list=tvars)]",
        "tf.gradients(loss, tvars)",
    )
    assert wrapped_only != conversion.converted
    result = _run(tmp_path, "wrapped_only.py", wrapped_only)
    _assert_trains(_losses(result.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" in result.stderr
    assert "AMPIFY_RUNNER loss-scale compute_gradients" not in result.stderr


SESSION_FIRST = '''\
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
sess = tf.Session()

x = tf.placeholder(tf.float32, [None, 8])
loss = tf.reduce_mean(tf.square(tf.layers.dense(x, 8)))
train_op = tf.train.AdamOptimizer(0.01).minimize(loss)
sess.run(tf.global_variables_initializer())
for step in range(12):
    _, value = sess.run([train_op, loss], {x: np.ones((4, 8), np.float32)})
    print("step %d loss %.6f" % (step, value))
'''


def test_a_session_created_before_the_wrapper_without_a_config_is_given_one_and_really_gets_the_rewrite(tmp_path):
    """`sess = tf.Session()` before the optimizer: a Session created before the wrapper never gets
    the rewrite (the original, run as it is wrapped by hand, converts 0 nodes). ampify binds a
    config with the rewrite turned on and hands it to the Session: the graph runs in float16."""
    conversion = convert_source(SESSION_FIRST, filename="session_first.py")
    assert [(f.code, f.line) for f in conversion.findings if f.code in ("AMP105", "AMP113")] == [("AMP105", 5)]
    assert "sess = tf.Session(config=session_config)" in conversion.converted
    result = _run(tmp_path, "session_first.py", conversion.converted)
    _assert_trains(_losses(result.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in result.stderr
    assert "AMPIFY_RUNNER session with graph rewrite" in result.stderr
    assert _converted_nodes(result.stderr) > 0, result.stderr[-4000:]
    wrapped_only = SESSION_FIRST.replace(
        "tf.train.AdamOptimizer(0.01)", "tf.train.experimental.enable_mixed_precision_graph_rewrite(tf.train.AdamOptimizer(0.01))")
    by_hand = _run(tmp_path, "by_hand.py", wrapped_only)
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in by_hand.stderr
    assert _converted_nodes(by_hand.stderr) == 0  # why the config is needed


def test_a2c_optimizer_built_after_tf_gradients_is_moved_up_and_scales_the_loss(tmp_path):
    source, conversion = _convert("exec_a2c_optimizer_after_gradients")
    rewrites = [f for f in conversion.findings if f.code == "AMP103"]
    assert len(rewrites) == 1 and "moved the construction of trainer" in rewrites[0].message
    assert [f.line for f in conversion.findings if f.code == "AMP110"] == [44]
    converted_text = conversion.converted
    assert converted_text.index("trainer = ") < converted_text.index("trainer.compute_gradients(")
    assert "clip_by_global_norm(grads, max_grad_norm)" in converted_text  # clipping kept

    converted = _run(tmp_path, "converted.py", converted_text)
    _assert_trains(_losses(converted.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in converted.stderr
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]


STAR_OPS = '''\
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()


def linear(x, units):
    w = tf.get_variable("w", [x.shape[-1], units])
    return tf.matmul(x, w)
'''

STAR_TRAIN = '''\
from ops import *

x = tf.placeholder(tf.float32, [None, 8])
loss = tf.reduce_mean(tf.square(linear(x, 8) - 1.0))
train_op = tf.train.AdamOptimizer(0.05).minimize(loss)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for step in range(12):
        _, value = sess.run([train_op, loss], {x: np.ones((4, 8), np.float32)})
        print("step %d loss %.6f" % (step, value))
'''


def test_tf_from_a_star_import_is_converted_and_trains_with_the_rewrite(tmp_path):
    """`from ops import *` brings `tf` (issue #12, item 6): it was "not applicable" before."""
    conversion = convert_source(STAR_TRAIN, filename="train.py")
    assert conversion.converted is not None, conversion.reason
    assert [f.code for f in conversion.findings][:2] == ["AMP102", "AMP121"]
    converted = conversion.converted
    assert converted.index("import tensorflow\n") < converted.index("from ops import *")
    (tmp_path / "ops.py").write_text(STAR_OPS)
    result = _run(tmp_path, "train.py", converted)
    _assert_trains(_losses(result.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in result.stderr
    assert _converted_nodes(result.stderr) > 0, result.stderr[-4000:]


def test_a_session_created_by_the_caller_module_gets_the_rewrite_through_its_config(tmp_path):
    """DCGAN-tensorflow's layout (#14): main.py opens the Session, model.py builds the optimizer
    afterwards. Converted as a repository, main.py's config turns the rewrite on and the graph
    really runs in float16; model.py converted alone keeps the AMP113 warning, and its Session
    really gets no rewrite."""
    case = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / "tf1_session_elsewhere" / "input"
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'dcgan-like'\n")
    for name in ("main.py", "model.py"):
        (project / name).write_text((case / name).read_text())
    alone = subprocess.run([sys.executable, "-m", "ampify", str(project / "model.py")], capture_output=True, text=True,
                           cwd=tmp_path, timeout=120)
    assert "AMP113" in alone.stdout and "run ampify on both files or on the repository" in alone.stdout, alone.stdout
    assert "rewriter_config_pb2" not in (project / "main.py").read_text()
    before = _run_module(project)
    _assert_trains(_losses(before.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in before.stderr
    assert _converted_nodes(before.stderr) == 0, before.stderr[-4000:]

    (project / "model.py").write_text((case / "model.py").read_text())
    _convert_project_and_train_in_float16(project, tmp_path)


@pytest.mark.parametrize("case", ["tf1_session_elsewhere_inline_config", "tf1_session_elsewhere_no_config",
                                  "tf1_session_registry", "tf1_session_shared_by_two_agents",
                                  "tf1_session_elsewhere_through_a_star_import", "tf1_session_opened_around_a_builder_function"])
def test_a_caller_session_with_an_inline_config_or_none_gets_the_rewrite_too(case, tmp_path):
    """hwalsuklee/tensorflow-generative-model-collections' main.py opens
    `tf.Session(config=tf.ConfigProto(allow_soft_placement=True))`: the config is bound to a new
    variable first and given the rewrite (also for `tf.Session()` with none), also when the model
    class is picked from a list (`for model in models: model(sess, ...)`) or when two agents built
    under their own variable scopes share it (MorvanZhou's Double DQN: one config, once), or when
    main.py's `tf` comes from `from utils import *` (taki0112's UGATIT), or when a helper of main.py
    builds the model from the Session main() hands it (carpedm20's NTM), and the converted project's
    graph really runs in float16."""
    folder = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / case / "input"
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'gan-collection-like'\n")
    for source in folder.glob("*.py"):
        (project / source.name).write_text(source.read_text())
    _convert_project_and_train_in_float16(project, tmp_path)


def test_a_class_creating_its_own_session_when_none_is_handed_in_gets_the_rewrite(tmp_path):
    """MorvanZhou's DQN agents take `sess=None` and create their own Session after building the
    optimizer; main.py hands none. No Session warning (it was a false AMP113), nothing written in
    main.py, and the agent's own Session really runs the graph in float16."""
    folder = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / "tf1_own_session_when_none_passed"
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'dqn-like'\n")
    for source in (folder / "input").glob("*.py"):
        (project / source.name).write_text(source.read_text())
    converted = subprocess.run([sys.executable, "-m", "ampify", str(project)], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert converted.returncode == 0 and "AMP113" not in converted.stdout, converted.stdout + converted.stderr
    assert (project / "main.py").read_text() == (folder / "input" / "main.py").read_text()
    after = _run_module(project)
    _assert_trains(_losses(after.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" in after.stderr
    assert _converted_nodes(after.stderr) > 0, after.stderr[-4000:]


def _convert_project_and_train_in_float16(project: Path, tmp_path: Path) -> None:
    """ampify the whole project: main.py's Session config gets the rewrite, and the project's graph
    really runs in float16 under the runner."""
    converted = subprocess.run([sys.executable, "-m", "ampify", str(project)], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    assert "auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON" in (project / "main.py").read_text()
    after = _run_module(project)
    _assert_trains(_losses(after.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" in after.stderr
    assert _converted_nodes(after.stderr) > 0, after.stderr[-4000:]


SESSION_CONFIG_FIRST = """\
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()

with tf.Graph().as_default():
    session_conf = tf.ConfigProto(allow_soft_placement=True)
    sess = tf.Session(config=session_conf)
    with sess.as_default():
        x = tf.placeholder(tf.float32, [None, 16])
        y = tf.placeholder(tf.float32, [None, 1])
        hidden = tf.layers.dense(x, 64, tf.nn.relu)
        loss = tf.reduce_mean(tf.square(tf.layers.dense(hidden, 1) - y))
        optimizer = tf.train.AdamOptimizer(1e-2)
        train_op = optimizer.apply_gradients(optimizer.compute_gradients(loss))
        sess.run(tf.global_variables_initializer())
        rng = np.random.RandomState(0)
        data = rng.randn(64, 16).astype("float32")
        target = data.sum(axis=1, keepdims=True)
        for step in range(12):
            _, value = sess.run([train_op, loss], feed_dict={x: data, y: target})
            print("step %d loss %f" % (step, value))
"""


def test_a_session_created_before_the_optimizer_in_the_same_file_gets_the_rewrite_through_its_config(tmp_path):
    """dennybritz/cnn-text-classification-tf's train.py creates `sess = tf.Session(config=
    session_conf)` and then builds the model and optimizer: that Session never got the rewrite
    (the file was 'changed, incomplete'). Its config now turns it on, and the graph runs in
    float16; the original runs none of it."""
    conversion = convert_source(SESSION_CONFIG_FIRST, filename="train.py")
    assert conversion.status.value == "changed", (conversion.status, conversion.findings)
    assert "AMP105" in [f.code for f in conversion.findings] and "AMP113" not in [f.code for f in conversion.findings]
    after = _run(tmp_path, "train.py", conversion.converted)
    _assert_trains(_losses(after.stdout))
    assert "AMPIFY_RUNNER session with graph rewrite" in after.stderr
    assert _converted_nodes(after.stderr) > 0, after.stderr[-4000:]
    before = _run(tmp_path, "original.py", SESSION_CONFIG_FIRST)
    assert "AMPIFY_RUNNER session with graph rewrite" not in before.stderr


SESSION_HANDED_TO_CLASSES = """\
import numpy as np
import tensorflow.compat.v1 as tf

tf.disable_v2_behavior()
tf.set_random_seed(0)


class Actor(object):
    def __init__(self, sess, n_features, lr):
        self.sess = sess
        self.s = tf.placeholder(tf.float32, [None, n_features])
        self.y = tf.placeholder(tf.float32, [None, 1])
        hidden = tf.layers.dense(self.s, 64, tf.nn.relu)
        self.loss = tf.reduce_mean(tf.square(tf.layers.dense(hidden, 1) - self.y))
        with tf.variable_scope('actor_train'):
            self.train_op = tf.train.AdamOptimizer(lr).minimize(self.loss)

    def learn(self, x, y):
        return self.sess.run([self.train_op, self.loss], {self.s: x, self.y: y})[1]


class Critic(object):
    def __init__(self, sess, n_features, lr):
        self.sess = sess
        self.s = tf.placeholder(tf.float32, [None, n_features])
        self.v = tf.layers.dense(self.s, 1)
        self.loss = tf.reduce_mean(tf.square(self.v))
        with tf.variable_scope('critic_train'):
            self.train_op = tf.train.AdamOptimizer(lr).minimize(self.loss)

    def learn(self, x):
        return self.sess.run([self.train_op, self.loss], {self.s: x})[1]


sess = tf.Session()
actor = Actor(sess, n_features=16, lr=1e-2)
critic = Critic(sess, n_features=16, lr=1e-2)
sess.run(tf.global_variables_initializer())
rng = np.random.RandomState(0)
data = rng.randn(64, 16).astype("float32")
target = data.sum(axis=1, keepdims=True)
for step in range(12):
    critic.learn(data)
    print("step %d loss %f" % (step, actor.learn(data, target)))
"""


def test_a_session_handed_to_classes_of_the_same_file_gets_the_rewrite_through_its_config(tmp_path):
    """MorvanZhou's AC_CartPole.py and DDPG.py: `sess = tf.Session()` at module level, then
    `Actor(sess, ...)` and `Critic(sess, ...)`, classes of the same file whose constructors build
    the optimizers. The wrapper alone came after that Session (the file was "changed,
    incomplete"): the Session's config now turns the rewrite on, once for both classes, and the
    graph runs in float16; the same classes built from a function handed the Session keep the
    AMP113 warning (ampify cannot see where that Session is created)."""
    conversion = convert_source(SESSION_HANDED_TO_CLASSES, filename="ac.py")
    assert conversion.status.value == "changed", (conversion.status, conversion.findings)
    assert [f.code for f in conversion.findings if f.code in ("AMP105", "AMP113")] == ["AMP105"]
    assert conversion.converted.count("auto_mixed_precision = rewriter_config_pb2.RewriterConfig.ON") == 1
    after = _run(tmp_path, "ac.py", conversion.converted)
    _assert_trains(_losses(after.stdout))
    assert after.stderr.count("AMPIFY_RUNNER loss-scale compute_gradients") == 2
    assert "AMPIFY_RUNNER session with graph rewrite" in after.stderr
    assert _converted_nodes(after.stderr) > 0, after.stderr[-4000:]

    in_a_function = SESSION_HANDED_TO_CLASSES.replace(
        "sess = tf.Session()\nactor = Actor(sess, n_features=16, lr=1e-2)\ncritic = Critic(sess, n_features=16, lr=1e-2)\n",
        "def build(sess):\n    return Actor(sess, n_features=16, lr=1e-2), Critic(sess, n_features=16, lr=1e-2)\n\n\n"
        "sess = tf.Session()\nactor, critic = build(sess)\n")
    assert in_a_function != SESSION_HANDED_TO_CLASSES
    handed = convert_source(in_a_function, filename="ac.py")
    assert [f.code for f in handed.findings if f.code in ("AMP105", "AMP113")] == ["AMP113", "AMP113"]
    assert handed.status.value == "changed, incomplete"


def _run_module(project: Path):
    """main.py of a two-module project under the runner, from the project folder."""
    runner = project / "amp_runner.py"
    runner.write_text(RUNNER)
    env = dict(os.environ)
    env.update(TF_USE_LEGACY_KERAS="1", TF_AUTO_MIXED_PRECISION_GRAPH_REWRITE_EMULATE_FP16="0",
               TF_CPP_MIN_LOG_LEVEL="0", CUDA_VISIBLE_DEVICES="")
    result = subprocess.run([sys.executable, str(runner), str(project / "main.py")], capture_output=True, text=True,
                            env=env, cwd=project, timeout=300)
    assert result.returncode == 0, result.stderr[-4000:]
    return result


def test_tower_gradients_returned_by_a_helper_are_computed_by_the_wrapped_optimizer(tmp_path):
    """tower_gradients() returns tf.gradients results, the caller averages and applies them: the
    helper gets `optimizer=None` and uses optimizer.compute_gradients when given it, the call in the
    tower loop passes the optimizer. Converted, the loss-scale optimizer's compute_gradients runs
    (once per tower) and the graph trains in float16; the original calls it never."""
    source, conversion = _convert("exec_tower_gradients_helper")
    assert [f.code for f in conversion.findings if f.severity.value != "info"] == []
    assert "def tower_gradients(features, returns, optimizer=None):" in conversion.converted
    assert "tower_gradients(feature_parts[i], return_parts[i], optimizer=optimizer)" in conversion.converted

    converted = _run(tmp_path, "converted.py", conversion.converted)
    _assert_trains(_losses(converted.stdout))
    assert converted.stderr.count("AMPIFY_RUNNER loss-scale compute_gradients") == 2
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    wrapped_only = conversion.converted.replace(", optimizer=optimizer)", ")")
    by_hand = _run(tmp_path, "wrapped_only.py", wrapped_only)
    _assert_trains(_losses(by_hand.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" not in by_hand.stderr  # why the helper needs it


def test_tower_gradients_of_a_helper_in_another_module_are_loss_scaled_in_one_change_set(tmp_path):
    """main.py applies what model.tower_gradients() returns (tf.gradients there). Converted as a
    repository, model.py's helper takes the optimizer and main.py passes it: the loss-scale
    optimizer's compute_gradients runs once per tower and the graph runs in float16. main.py
    converted alone keeps the gradients as they are and says which module to add."""
    case = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / "tf1_tower_gradients_in_other_module"
    project = tmp_path / "project"
    shutil.copytree(case / "input", project)
    (project / "pyproject.toml").write_text("[project]\nname = 'towers'\n")
    alone = subprocess.run([sys.executable, "-m", "ampify", str(project / "main.py"), "--check"], capture_output=True,
                           text=True, cwd=tmp_path, timeout=120)
    assert "model.py is not in this run: run ampify on both files or on the repository" in alone.stdout, alone.stdout
    converted = subprocess.run([sys.executable, "-m", "ampify", str(project)], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert converted.returncode == 0, converted.stdout + converted.stderr
    for name in ("main.py", "model.py"):
        assert (project / name).read_text() == (case / "expected" / name).read_text()
    after = _run_module(project)
    _assert_trains(_losses(after.stdout))
    assert after.stderr.count("AMPIFY_RUNNER loss-scale compute_gradients") == 2
    assert _converted_nodes(after.stderr) > 0, after.stderr[-4000:]


def test_a_log_of_a_sigmoid_probability_keeps_the_sigmoid_in_float32_and_the_loss_finite(tmp_path):
    """wiseodd/generative-models' TF1 GANs take `log(1 - D_fake)` of a sigmoid's probability. The
    wrapper alone runs that sigmoid in float16 and a confident discriminator's loss is inf at every
    step (the loss-scale optimizer skips them all). Converted, Sigmoid is off the rewrite's lists
    (AMP106): the graph still runs in float16 elsewhere, and the loss is finite and falls."""
    source, conversion = _convert("exec_log_of_sigmoid_gan")
    assert "AMP106" in [f.code for f in conversion.findings]
    converted = _run(tmp_path, "converted.py", conversion.converted)
    losses = _losses(converted.stdout)
    assert len(losses) == 12 and all(value == value and abs(value) != float("inf") for value in losses), losses
    assert 8 < losses[0] < 11  # about -log(1 - sigmoid(9)), as in float32
    assert losses[-1] < losses[0] - 1, losses  # a confident discriminator unlearns slowly, but it does
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]

    wrapper_only = "\n".join(line for line in conversion.converted.splitlines() if "_REMOVE" not in line) + "\n"
    assert wrapper_only != conversion.converted
    without = _run(tmp_path, "wrapper_only.py", wrapper_only)
    assert all(value == float("inf") for value in _losses(without.stdout)), without.stdout


def test_ddpg_actor_gradients_with_the_optimizer_in_a_later_scope_are_loss_scaled(tmp_path):
    """MorvanZhou's DDPG: `tf.gradients(ys=self.a, xs=..., grad_ys=a_grads)` in one variable scope, the
    optimizer built in the next `with tf.variable_scope('A_train'):`. The construction moves above the
    first scope and the gradients come from the wrapped optimizer's compute_gradients(self.a,
    grad_loss=a_grads): it runs under TensorFlow, the graph runs in float16, and the actor learns as
    the original does."""
    source, conversion = _convert("exec_ddpg_actor_gradients")
    assert [f.code for f in conversion.findings if f.severity.value != "info"] == []
    assert "opt.compute_gradients(self.a, var_list=self.e_params, grad_loss=a_grads)" in conversion.converted
    _assert_loss_scaled_in_float16_as_the_original_learns(tmp_path, source, conversion.converted)


def _assert_loss_scaled_in_float16_as_the_original_learns(tmp_path, source: str, converted_source: str) -> None:
    """The converted script runs the wrapped optimizer's compute_gradients once, its graph runs in
    float16 and it learns; the original learns too, with no loss scaling."""
    converted = _run(tmp_path, "converted.py", converted_source)
    _assert_trains(_losses(converted.stdout))
    assert converted.stderr.count("AMPIFY_RUNNER loss-scale compute_gradients") == 1
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    original = _run(tmp_path, "original.py", source)
    _assert_trains(_losses(original.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" not in original.stderr


def test_char_rnn_optimizer_alone_in_a_name_scope_moves_with_its_scope(tmp_path):
    """char-rnn-tensorflow: clipped `tf.gradients(self.cost, tvars)`, then `with tf.name_scope(
    'optimizer'): optimizer = tf.train.AdamOptimizer(self.lr)` (the construction is the whole body).
    The whole `with` moves above the gradients; the converted graph runs in float16 with loss
    scaling and learns as the original does."""
    source, conversion = _convert("exec_char_rnn_optimizer_scope")
    assert [f.code for f in conversion.findings if f.severity.value != "info"] == []
    assert "moved the construction of optimizer from line 27 up to line 24" in " ".join(
        f.message for f in conversion.findings)
    converted = _run(tmp_path, "converted.py", conversion.converted)
    _assert_trains(_losses(converted.stdout))
    assert converted.stderr.count("AMPIFY_RUNNER loss-scale compute_gradients") == 1
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    original = _run(tmp_path, "original.py", source)
    _assert_trains(_losses(original.stdout))


def test_style_transfer_gram_matrices_stay_float32(tmp_path):
    """A Gram matrix of feature maps (fast-style-transfer's `tf.matmul(feats_T, feats) / size`): with the
    wrapper alone the rewrite runs it in float16, it overflows and every loss is inf; converted, the
    matrix products are off the allow list, the convolutions still convert, and the loss falls as in
    float32."""
    source, conversion = _convert("exec_style_transfer_gram_matrix")
    assert "AMP107" in [f.code for f in conversion.findings]
    converted = _run(tmp_path, "converted.py", conversion.converted)
    losses = _losses(converted.stdout)
    assert len(losses) == 12 and all(value == value and abs(value) != float("inf") for value in losses), losses
    assert losses[-1] < losses[0], losses
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    original = _losses(_run(tmp_path, "original.py", source).stdout)
    assert all(abs(a - b) < 1e-2 * abs(b) for a, b in zip(losses, original)), (losses, original)

    wrapper_only = "\n".join(line for line in conversion.converted.splitlines() if "LIST_REMOVE" not in line) + "\n"
    assert wrapper_only != conversion.converted
    without = _run(tmp_path, "wrapper_only.py", wrapper_only)
    assert all(value == float("inf") for value in _losses(without.stdout)), without.stdout


PROJECT_OPTIMIZER = '''
import sys
import tensorflow.compat.v1 as tf


class AveragingAdamOptimizer(tf.train.AdamOptimizer):
    """spinningup's MpiAdamOptimizer in miniature: compute_gradients takes var_list positionally."""

    def __init__(self, num_workers=1, **kwargs):
        self.num_workers = num_workers
        tf.train.AdamOptimizer.__init__(self, **kwargs)

    def compute_gradients(self, loss, var_list, **kwargs):
        print("PROJECT compute_gradients", file=sys.stderr, flush=True)
        grads_and_vars = super().compute_gradients(loss, var_list, **kwargs)
        return [(g / float(self.num_workers), v) for g, v in grads_and_vars if g is not None]
'''

PROJECT_TRAINING = '''
import numpy as np
import tensorflow.compat.v1 as tf

from mpi_tf import AveragingAdamOptimizer

tf.disable_v2_behavior()
tf.set_random_seed(0)
rng = np.random.RandomState(0)
x = tf.placeholder(tf.float32, [None, 8])
y = tf.placeholder(tf.float32, [None, 1])
hidden = tf.layers.dense(x, 32, activation=tf.nn.relu)
loss = tf.reduce_mean(tf.square(tf.layers.dense(hidden, 1) - y))
train_op = AveragingAdamOptimizer(learning_rate=1e-2).minimize(loss)
features = rng.randn(64, 8).astype("float32")
targets = features.sum(axis=1, keepdims=True)
with tf.Session() as sess:
    sess.run(tf.global_variables_initializer())
    for step in range(12):
        _, value = sess.run([train_op, loss], {x: features, y: targets})
        print("step", step, "loss", value)
'''


def test_an_optimizer_subclass_of_another_module_is_wrapped_and_trains(tmp_path):
    """spinningup's `MpiAdamOptimizer(learning_rate=lr).minimize(loss)`, the class in utils: the
    training module wraps it (AMP101), the wrapper's compute_gradients scales the loss and calls
    the subclass's own compute_gradients, and the converted script trains with the rewrite on."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "pyproject.toml").write_text("[project]\nname = 'rl'\n")
    (project / "mpi_tf.py").write_text(PROJECT_OPTIMIZER)
    (project / "ppo.py").write_text(PROJECT_TRAINING)
    run = subprocess.run([sys.executable, "-m", "ampify", "--diff", str(project / "ppo.py")],
                         capture_output=True, text=True, timeout=300)
    assert "AMP101 would wrap AveragingAdamOptimizer" in run.stdout + run.stderr, run.stdout + run.stderr
    subprocess.run([sys.executable, "-m", "ampify", str(project / "ppo.py")], check=True, capture_output=True,
                   timeout=300)
    converted_source = (project / "ppo.py").read_text()
    assert "enable_mixed_precision_graph_rewrite(AveragingAdamOptimizer(" in converted_source, converted_source
    shutil.copy(project / "mpi_tf.py", tmp_path / "mpi_tf.py")
    converted = _run(tmp_path, "converted.py", converted_source)
    _assert_trains(_losses(converted.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in converted.stderr
    assert "PROJECT compute_gradients" in converted.stderr
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]


#: tf.contrib is gone from TensorFlow 2: optimize_loss as tensorflow/contrib/layers/python/layers/
#: optimizers.py wrote it, for the arguments the fixture passes (a learning-rate tensor, a string or
#: a callable optimizer, clipping by global norm): the optimizer a string names is built from the
#: learning rate, a callable is called with it, and the gradients go through compute_gradients and
#: apply_gradients of whatever it built
OPTIMIZE_LOSS_STAND_IN = '''
import types

_v1 = tf.compat.v1
_NAMED = {"Adam": _v1.train.AdamOptimizer, "SGD": _v1.train.GradientDescentOptimizer}


def _optimize_loss(loss, global_step, learning_rate, optimizer, clip_gradients=None):
    lr = learning_rate
    if isinstance(optimizer, str):
        opt = _NAMED[optimizer](learning_rate=lr)
    else:
        opt = optimizer(lr)
        assert isinstance(opt, _v1.train.Optimizer), opt
    gradients = opt.compute_gradients(loss, _v1.trainable_variables())
    if clip_gradients is not None:
        grads, variables = zip(*gradients)
        grads, _ = _v1.clip_by_global_norm(grads, clip_gradients)
        gradients = list(zip(grads, variables))
    update = opt.apply_gradients(gradients, global_step=global_step, name="train")
    return _v1.tuple([loss], control_inputs=[update])[0]


_v1.contrib = tf.contrib = types.SimpleNamespace(layers=types.SimpleNamespace(optimize_loss=_optimize_loss))
'''


def test_optimize_loss_given_an_optimizer_name_trains_with_the_wrapped_optimizer_it_is_handed(tmp_path):
    """optimize_loss(optimizer="Adam") spelled as `lambda lr: WRAPPER(tf.train.AdamOptimizer(learning_rate=lr))`:
    optimize_loss calls it with its decayed learning rate, the wrapper scales the loss in
    compute_gradients and the graph runs in float16; the original, under the same runner, builds its
    Adam inside optimize_loss and converts nothing. Both train, to the same losses within float16's
    tolerance."""
    source, conversion = _convert("exec_optimize_loss_named")
    assert [f.code for f in conversion.findings if f.code in ("AMP126", "AMP117")] == ["AMP126"]
    converted = _run(tmp_path, "converted.py", conversion.converted, OPTIMIZE_LOSS_STAND_IN)
    original = _run(tmp_path, "original.py", source, OPTIMIZE_LOSS_STAND_IN)
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in converted.stderr
    assert _converted_nodes(converted.stderr) > 0, converted.stderr[-4000:]
    assert "AMPIFY_RUNNER loss-scale compute_gradients" not in original.stderr
    assert _converted_nodes(original.stderr) == 0, original.stderr[-4000:]
    mixed, fp32 = _losses(converted.stdout), _losses(original.stdout)
    _assert_trains(mixed)
    _assert_trains(fp32)
    assert mixed == pytest.approx(fp32, rel=2e-2, abs=2e-2), (mixed, fp32)


def test_a_checkpoint_of_the_float32_script_does_not_restore_into_the_converted_graph_as_amp127_says(tmp_path):
    """AMP127's claim, checked: the float32 script's checkpoint fails to restore into the converted
    graph (the loss scale's variables are missing from it), while the converted script resumes from
    a checkpoint it wrote itself."""
    original = FIXTURES / "saver_restore_of_an_old_checkpoint.in.py"
    converted = tmp_path / "converted.py"
    converted.write_text(convert_source(original.read_text(), filename="train.py").converted)

    def run(script, checkpoint, *mode):
        return subprocess.run([sys.executable, str(script), str(checkpoint), *mode], capture_output=True, text=True,
                              timeout=300, env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"})

    assert run(original, tmp_path / "fp32.ckpt").returncode == 0
    failed = run(converted, tmp_path / "fp32.ckpt", "resume")
    assert failed.returncode != 0 and "NotFoundError" in failed.stderr and "not found in checkpoint" in failed.stderr
    assert run(converted, tmp_path / "mixed.ckpt").returncode == 0
    resumed = run(converted, tmp_path / "mixed.ckpt", "resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]


def test_an_agent_built_inside_the_session_its_caller_opened_is_said_to_stay_float32(tmp_path):
    """openai/maddpg's layout: train.py opens `with U.single_threaded_session():` (a helper module
    creates the tf.Session) and then builds the agents, whose class (another module) builds the
    optimizer. Converted, the wrapper scales the loss but the Session, created first, never gets the
    rewrite: AMP113 says so, naming the caller's lines, and the run shows no node in float16. Once
    the Session is opened after the agents are built, as the warning says, the graph runs in float16."""
    case = Path(__file__).resolve().parent.parent / "fixtures" / "repositories" / "tf1_session_opened_by_the_caller"
    project = tmp_path / "project"
    shutil.copytree(case / "input", project)
    (project / "pyproject.toml").write_text("[project]\nname = 'maddpg-like'\n")
    converted = subprocess.run([sys.executable, "-m", "ampify", str(project)], capture_output=True, text=True,
                               cwd=tmp_path, timeout=120)
    assert converted.returncode == 1, converted.stdout + converted.stderr  # written, but incomplete
    assert "AMP113" in converted.stdout and "train.py:11 in get_trainers()" in converted.stdout, converted.stdout
    assert "agents/trainer.py: changed, incomplete" in converted.stdout, converted.stdout
    assert (project / "agents" / "trainer.py").read_text() == (case / "expected" / "agents" / "trainer.py").read_text()

    driver = (project / "train.py").read_text()
    (project / "main.py").write_text(driver)
    as_converted = _run_module(project)
    _assert_trains(_losses(as_converted.stdout))
    assert "AMPIFY_RUNNER loss-scale compute_gradients" in as_converted.stderr
    assert _converted_nodes(as_converted.stderr) == 0, as_converted.stderr[-4000:]

    session_after = driver.replace("    with U.single_threaded_session():\n        trainers = get_trainers(2, 3e-2)\n",
                                   "    trainers = get_trainers(2, 3e-2)\n    with U.single_threaded_session():\n")
    assert session_after != driver
    (project / "main.py").write_text(session_after)
    fixed = _run_module(project)
    _assert_trains(_losses(fixed.stdout))
    assert _converted_nodes(fixed.stderr) > 0, fixed.stderr[-4000:]


def test_ddpg_actor_optimizer_built_inline_is_named_and_its_gradients_loss_scaled(tmp_path):
    """pemami4911's DDPG actor: `tf.train.AdamOptimizer(lr).apply_gradients(zip(grads, params))` with
    grads from tf.gradients(..., -action_gradient): the optimizer is named on a line of its own above
    tf.gradients and computes them (grad_loss=...), so they are loss-scaled; it runs under TensorFlow,
    the graph runs in float16, and the actor learns as the original does."""
    source, conversion = _convert("exec_ddpg_actor_optimizer_built_inline")
    assert [f.code for f in conversion.findings if f.severity.value != "info"] == []
    assert "optimizer.compute_gradients(\n            self.scaled_out, var_list=self.network_params, " \
           "grad_loss=-self.action_gradient)" in conversion.converted
    assert "self.optimize = optimizer.apply_gradients(" in conversion.converted
    _assert_loss_scaled_in_float16_as_the_original_learns(tmp_path, source, conversion.converted)
