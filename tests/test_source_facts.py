"""SourceFacts: the names a module uses, as the stdlib parser sees them, for the screens."""

from __future__ import annotations

import warnings

from ampify.transforms.kit.source_facts import SourceFacts
from ampify.transforms.tf1.screen import may_concern_tf1_graph_rewrite
from ampify.transforms.torch.screen import may_concern_torch_training_code


def test_identifiers_come_from_every_place_a_name_can_be():
    facts = SourceFacts.from_source(
        "import tensorflow.compat.v1 as tf\n"
        "from torch.cuda.amp import GradScaler as GS\n"
        "@decorate\n"
        "class Model(Base):\n"
        "    def method(self, param, *args, kwonly=1, **kw):\n"
        "        global counter\n"
        "        try:\n"
        "            call(keyword_arg=value.attribute)\n"
        "        except Error as caught:\n"
        "            pass\n"
        "        return f'{in_fstring}'\n"
        "match thing:\n"
        "    case Point(x=px, y=py) as whole:\n"
        "        pass\n"
        "    case {**rest}:\n"
        "        pass\n"
        "    case [*tail]:\n"
        "        pass\n"
    )
    for name in (
        "tensorflow", "compat", "v1", "tf", "torch", "cuda", "amp", "GradScaler", "GS", "decorate",
        "Model", "Base", "method", "self", "param", "args", "kwonly", "kw", "counter", "call",
        "keyword_arg", "value", "attribute", "Error", "caught", "in_fstring", "thing", "Point",
        "x", "y", "px", "py", "whole", "rest", "tail",
    ):
        assert name in facts.identifiers, name
    assert facts.imported_modules == {"tensorflow.compat.v1", "torch.cuda.amp", "torch.cuda.amp.GradScaler"}
    assert facts.call_names == {"call"}


def test_comments_docstrings_and_strings_are_not_identifiers():
    facts = SourceFacts.from_source(
        '"""Call loss.backward() then optimizer.step()."""\n'
        "# loss.backward()\n"
        "message = 'optimizer.step()'\n"
    )
    assert not facts.identifiers & {"backward", "step", "optimizer", "loss"}
    assert not facts.call_names
    assert "optimizer.step()" in facts.strings


def test_unreadable_sources_rule_nothing_out():
    assert SourceFacts.from_source("print 'python 2'\n") is None
    assert SourceFacts.from_source(b"x = 1\x00\n") is None
    assert SourceFacts.from_source(b"# -*- coding: no-such-codec -*-\nx = 1\n") is None


def test_parser_warnings_are_not_printed():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert SourceFacts.from_source('pattern = "\\d+"\n') is not None


def test_relative_imports_are_not_framework_imports():
    facts = SourceFacts.from_source("from .tensorflow import thing\nfrom . import torch\n")
    assert not facts.imports("tensorflow")
    assert not facts.imports("torch")


def screen_tf1(source: str) -> bool:
    return may_concern_tf1_graph_rewrite(SourceFacts.from_source(source))


def screen_torch(source: str) -> bool:
    return may_concern_torch_training_code(SourceFacts.from_source(source))


def test_tf1_screen_needs_a_tensorflow_import_and_an_optimizer_or_mixed_precision():
    assert not screen_tf1("import tensorflow as tf\nx = tf.placeholder(tf.float32)  # AdamOptimizer\n")
    assert not screen_tf1("opt = tf.train.AdamOptimizer(0.1)\n")  # no tensorflow import
    assert screen_tf1("import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n")
    assert screen_tf1("from tensorflow.train import AdamOptimizer as A\nopt = A(0.1)\n")
    assert screen_tf1("import tensorflow as tf\nopt = getattr(tf.train, name)(0.1)\n")
    assert screen_tf1("import tensorflow as tf\nbuild('tf.train.MomentumOptimizer')\n")
    assert screen_tf1("import tensorflow as tf\ntf.contrib.layers.optimize_loss(loss, step, 0.1, 'Adam')\n")
    assert screen_tf1("import tensorflow as tf\ntrain_op = opt.apply_gradients(grads)\n")
    assert screen_tf1("import tensorflow as tf\nos.environ['TF_ENABLE_AUTO_MIXED_PRECISION'] = '1'\n")
    assert screen_tf1("import tensorflow as tf\ntf.keras.mixed_precision.set_global_policy(p)\n")
    assert screen_tf1("import tensorflow as tf\nopt = tf.keras.optimizers.Adam()\n")


def test_torch_screen_needs_a_training_call_a_hazard_or_mixed_precision():
    autograd_function = (
        "import torch\n"
        "class Square(torch.autograd.Function):\n"
        "    @staticmethod\n"
        "    def backward(ctx, grad):\n"
        "        '''Runs in loss.backward(); see optimizer.step().'''\n"
        "        return 2 * grad\n"
    )
    assert not screen_torch(autograd_function)
    assert screen_torch("loss.backward()\n")
    assert screen_torch("opt.step()\n")
    assert screen_torch("import torch\ncriterion = torch.nn.BCELoss()\n")
    assert screen_torch("from torch.nn.functional import binary_cross_entropy as bce\n")
    assert screen_torch("g = torch.autograd.grad(out, x, create_graph=True)\n")
    assert screen_torch("scores = scores.masked_fill(mask, -1e9)\n")
    assert screen_torch("from torch.cuda import amp\n")
    assert screen_torch("with torch.autocast('cuda'):\n    pass\n")
    assert screen_torch("from torch.distributed.fsdp import MixedPrecision\n")
