"""Every wrapper spelling ampify emits resolves, on the installed TensorFlow, to the real
enable_mixed_precision_graph_rewrite, for each import style a TF1 script may use."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import libcst as cst
import pytest

from ampify.convert import convert_source
from ampify.transforms.tf1.module_header import import_aliases

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("tensorflow") is None, reason="TensorFlow is not installed"
)

# import style -> a script using it (the optimizer built with that style's own spelling)
IMPORT_STYLES = {
    "import tensorflow as tf": "import tensorflow as tf\nopt = tf.train.AdamOptimizer(0.1)\n",
    "any alias of tensorflow": "import tensorflow as T\nopt = T.compat.v1.train.AdamOptimizer(0.1)\n",
    "import tensorflow": "import tensorflow\nopt = tensorflow.train.AdamOptimizer(0.1)\n",
    "import tensorflow.compat.v1 as tf": "import tensorflow.compat.v1 as tf\nopt = tf.train.AdamOptimizer(0.1)\n",
    "import tensorflow.compat.v1": "import tensorflow.compat.v1\nopt = tensorflow.compat.v1.train.AdamOptimizer(0.1)\n",
    "from tensorflow.compat import v1 as tf": "from tensorflow.compat import v1 as tf\nopt = tf.train.AdamOptimizer(0.1)\n",
    "from tensorflow.compat import v1": "from tensorflow.compat import v1\nopt = v1.train.AdamOptimizer(0.1)\n",
    "from tensorflow import compat": "from tensorflow import compat\nopt = compat.v1.train.AdamOptimizer(0.1)\n",
    "from tensorflow.compat.v1 import train": "from tensorflow.compat.v1 import train\nopt = train.AdamOptimizer(0.1)\n",
    "from tensorflow.train import AdamOptimizer": "from tensorflow.train import AdamOptimizer\nopt = AdamOptimizer(0.1)\n",
    "from-import with tf taken": "from tensorflow.train import AdamOptimizer\ntf = None\nopt = AdamOptimizer(0.1)\n",
    "import inside the function": "def f():\n    import tensorflow.compat.v1 as tf\n    return tf.train.AdamOptimizer(0.1)\n",
}


class _Wrappers(cst.CSTVisitor):
    def __init__(self):
        self.callees = []
        self.imports = {}

    def visit_Call(self, node):
        code = cst.Module(body=[]).code_for_node(node.func)
        if code.endswith("enable_mixed_precision_graph_rewrite"):
            self.callees.append(code)

    def visit_Import(self, node):
        self._note(node)

    def visit_ImportFrom(self, node):
        self._note(node)

    def _note(self, node):
        for local in import_aliases(node):
            self.imports[local] = cst.Module(body=[]).code_for_node(node)


def _emitted_spellings():
    cases = []
    for style, source in IMPORT_STYLES.items():
        conversion = convert_source(source)
        assert conversion.converted is not None, (style, conversion.reason)
        collector = _Wrappers()
        cst.parse_module(conversion.converted).visit(collector)
        assert collector.callees, style
        for callee in collector.callees:
            head = callee.split(".")[0]
            cases.append({"style": style, "callee": callee, "import": collector.imports[head]})
    return cases


CHECK = r'''
import json, sys
cases = json.loads(sys.stdin.read())
out = []
for case in cases:
    namespace = {}
    exec(case["import"], namespace)
    function = eval(case["callee"], namespace)
    out.append(getattr(function, "__name__", repr(function)))
print(json.dumps(out))
'''


def test_every_emitted_wrapper_spelling_resolves_on_installed_tensorflow():
    cases = _emitted_spellings()
    callees = {case["callee"] for case in cases}
    # The alias-preserving spellings really differ per style; none is TF2's missing
    # top-level `tf.train.experimental` reached from the v2 `tensorflow` module.
    assert "T.compat.v1.train.experimental.enable_mixed_precision_graph_rewrite" in callees
    assert "v1.train.experimental.enable_mixed_precision_graph_rewrite" in callees
    result = subprocess.run(
        [sys.executable, "-c", CHECK],
        input=json.dumps(cases),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    names = json.loads(result.stdout.strip().splitlines()[-1])
    for case, name in zip(cases, names):
        assert name == "enable_mixed_precision_graph_rewrite_v1", (case, name)
