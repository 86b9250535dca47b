"""Property tests: whatever the program, the transforms never raise, their output compiles, and
converting twice equals converting once.

Two sources of programs:
- hypothesmith: arbitrary valid Python from the grammar, alone and wrapped between a framework
  import header and a training-step footer, so that the transforms really parse and walk it;
- generated training scripts: PyTorch and TF1 training code assembled from the patterns the
  fixtures cover (import aliases, optimizers built at top level / in helpers / in methods,
  several optimizers, already-AMP code, CRLF and BOM), with noise statements between.
For generated training scripts a stronger property holds too: training code is never reported
as "not applicable" (a silent false negative); it is converted, already mixed precision, or
reported as not converted with a warning.
"""

from __future__ import annotations

import hypothesmith
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from ampify.convert import ConversionError, convert_source
from ampify.findings import FileStatus, Severity
from ampify.options import Options

PROPERTY_SETTINGS = settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large]
)
OPTIONS = st.sampled_from([Options(), Options(dtype="bfloat16"), Options(backend="apex")])
INPUT_FAULTS = ("not valid Python 3", "cannot decode", "valid Python, but LibCST", "Python 3.", "the file contains a NUL byte")


def compiles(source) -> bool:
    try:
        compile(source, "<generated>", "exec", dont_inherit=True)
        return True
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False


def assert_convert_invariants(source, options: Options):
    """The three properties, for any source: no exception (but a clear input fault), the
    output compiles, a second run changes nothing. Returns the first conversion or None."""
    try:
        first = convert_source(source, options, filename="generated.py")
    except ConversionError as error:
        assert str(error).startswith(INPUT_FAULTS), f"ampify broke a program: {error}"
        return None
    except RecursionError:
        return None  # the engine reports it as "too deeply nested"; LibCST's own limit
    if first.status in (FileStatus.CHANGED, FileStatus.CHANGED_INCOMPLETE):
        assert first.converted is not None and first.converted != source
        assert compiles(first.converted), first.converted
        assert first.findings, "a change must say what it changed"
        again = convert_source(first.converted, options, filename="generated.py")
        assert again.converted is None, "not idempotent: the second run changed the file again"
        assert again.status is not FileStatus.FAILED
    else:
        assert first.converted is None
    return first


# --- arbitrary programs (hypothesmith) -----------------------------------------------------

TORCH_HEADER = "import torch\nimport torch.nn as nn\nfrom torch import optim\nimport tensorflow.compat.v1 as tf\n"
TRAINING_FOOTER = (
    "\nmodel = nn.Linear(2, 2)\noptimizer = optim.SGD(model.parameters(), lr=0.1)\n"
    "loss = model(torch.ones(1, 2)).sum()\noptimizer.zero_grad()\nloss.backward()\noptimizer.step()\n"
    "train_op = tf.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(tf.get_variable('w', [1])))\n"
)


@PROPERTY_SETTINGS
@given(program=hypothesmith.from_grammar(), options=OPTIONS)
def test_arbitrary_programs(program, options):
    assert_convert_invariants(program, options)


@settings(PROPERTY_SETTINGS, max_examples=15)  # each example parses and analyses a training script
@given(program=hypothesmith.from_grammar(), options=OPTIONS)
def test_arbitrary_programs_inside_a_training_script(program, options):
    source = TORCH_HEADER + program + ("\n" if not program.endswith("\n") else "") + TRAINING_FOOTER
    assume(compiles(source))
    assert_convert_invariants(source, options)
    assert_convert_invariants(source.encode("utf-8"), options)


# --- generated training scripts --------------------------------------------------------------

NOISE = st.sampled_from(
    [
        "",
        "# a comment\n",
        "print('step')\n",
        "log = {'loss': 0.0}\n",
        "if False:\n    pass\n",
        "for _i in range(1):\n    _ = _i\n",
        "try:\n    import numpy as np\nexcept ImportError:\n    np = None\n",
        "@staticmethod\ndef helper(x):\n    return x\n",
        "with open(__file__) as _f:\n    _f.read()\n",
    ]
)


@st.composite
def torch_training_script(draw) -> str:
    torch_name = draw(st.sampled_from(["torch", "th"]))
    header = "import torch\n" if torch_name == "torch" else "import torch as th\n"
    optim_ref = draw(st.sampled_from([f"{torch_name}.optim", "optim", "O"]))
    if optim_ref == "optim":
        header += draw(st.sampled_from(["from torch import optim\n", "import torch.optim as optim\n"]))
    elif optim_ref == "O":
        header += "import torch.optim as O\n"
    optimizer_class = draw(st.sampled_from(["SGD", "Adam", "AdamW", "RMSprop"]))
    extra = ", momentum=0.9" if optimizer_class == "SGD" and draw(st.booleans()) else ""
    build = f"{optim_ref}.{optimizer_class}(model.parameters(), lr=0.01{extra})"
    model = f"model = {torch_name}.nn.Linear(4, 1)\n"
    loss = f"loss = (model({torch_name}.ones(2, 4)) - 1).pow(2).mean()"
    backward = draw(st.sampled_from(["loss.backward()", "loss.backward(retain_graph=False)"]))
    noise = [draw(NOISE) for _ in range(3)]
    already = draw(st.booleans())
    amp_open = f"with {torch_name}.autocast('cpu', dtype={torch_name}.bfloat16):\n" if already else ""

    def body(indent: str, opt: str) -> str:
        lines = [f"{opt}.zero_grad()"]
        if already:
            lines += [amp_open.rstrip("\n"), "    " + loss]
        else:
            lines += [loss]
        lines += [backward, f"{opt}.step()"]
        return "".join(indent + line + "\n" for line in lines)

    shape = draw(st.sampled_from(["top", "function", "helper", "method", "split_methods", "gan"]))
    if shape == "top":
        code = model + f"optimizer = {build}\n" + noise[0] + "for epoch in range(2):\n" + body("    ", "optimizer")
    elif shape == "function":
        code = ("def train(steps=2):\n    " + model + f"    optimizer = {build}\n"
                "    for _ in range(steps):\n" + body("        ", "optimizer") + noise[0]
                + "\nif __name__ == '__main__':\n    train()\n")
    elif shape == "helper":
        code = (model + f"def make_optimizer(model):\n    return {build}\n\n" + noise[0]
                + "optimizer = make_optimizer(model)\nstep = 0\nwhile step < 2:\n" + body("    ", "optimizer")
                + "    step += 1\n")
    elif shape == "method":
        code = ("class Trainer:\n    def __init__(self):\n        self." + model.strip() + "\n"
                + "        model = self.model\n" + f"        self.opt = {build}\n\n"
                + "    def fit(self):\n        model = self.model\n" + body("        ", "self.opt") + noise[0])
    elif shape == "split_methods":
        # pix2pix style: backward() in a helper method, the step in the method that calls it
        steps = body("        ", "self.opt").splitlines(keepends=True)
        code = ("class Trainer:\n    def __init__(self):\n        self." + model.strip() + "\n"
                + "        model = self.model\n" + f"        self.opt = {build}\n\n"
                + "    def backward_step(self):\n        model = self.model\n" + "".join(steps[1:-1])
                + "\n    def fit(self):\n" + steps[0] + "        self.backward_step()\n" + steps[-1] + noise[0])
    else:
        generator = f"{optim_ref}.Adam(netG.parameters(), lr=2e-4)"
        discriminator = f"{optim_ref}.Adam(netD.parameters(), lr=2e-4)"
        code = (f"netG = {torch_name}.nn.Linear(4, 4)\nnetD = {torch_name}.nn.Linear(4, 1)\nmodel = netD\n"
                + f"optG = {generator}\noptD = {discriminator}\n" + noise[0]
                + "for _ in range(2):\n" + body("    ", "optD") + body("    ", "optG"))
    return header + noise[1] + code + noise[2]


@st.composite
def tf1_training_script(draw) -> str:
    header = draw(
        st.sampled_from(
            [
                "import tensorflow.compat.v1 as tf\ntf.disable_v2_behavior()\n",
                "import tensorflow as tf\n",
                "from tensorflow.compat import v1 as tf\n",
            ]
        )
    )
    optimizer = draw(
        st.sampled_from(
            ["tf.train.AdamOptimizer(1e-3)", "tf.train.GradientDescentOptimizer(0.1)",
             "tf.train.MomentumOptimizer(0.1, 0.9)", "tf.train.RMSPropOptimizer(learning_rate=0.01)"]
        )
    )
    graph = ("x = tf.placeholder(tf.float32, [None, 4])\nw = tf.get_variable('w', [4, 1])\n"
             "loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))\n")
    step = draw(
        st.sampled_from(
            [
                "train_op = {opt}.minimize(loss)\n",
                "opt = {opt}\ntrain_op = opt.minimize(loss, global_step=tf.train.get_or_create_global_step())\n",
                "opt = {opt}\ngrads = opt.compute_gradients(loss)\ntrain_op = opt.apply_gradients(grads)\n",
                "def build_train_op(loss):\n    return {opt}.minimize(loss)\n\ntrain_op = build_train_op(loss)\n",
            ]
        )
    ).format(opt=optimizer)
    session = ("with tf.Session() as sess:\n    sess.run(tf.global_variables_initializer())\n"
               "    sess.run(train_op, {x: [[1.0, 2.0, 3.0, 4.0]]})\n")
    return header + draw(NOISE) + graph + draw(NOISE) + step + session


def line_endings(source: str, crlf: bool, bom: bool):
    data = source.replace("\n", "\r\n") if crlf else source
    return (b"\xef\xbb\xbf" if bom else b"") + data.encode("utf-8")


@PROPERTY_SETTINGS
@given(script=st.one_of(torch_training_script(), tf1_training_script()), options=OPTIONS,
       crlf=st.booleans(), bom=st.booleans())
def test_generated_training_scripts(script, options, crlf, bom):
    assert compiles(script), script
    source = line_endings(script, crlf, bom)
    first = assert_convert_invariants(source, options)
    assert first is not None
    if first.converted is not None:
        assert first.converted.startswith(b"\xef\xbb\xbf") == bom, "the BOM must be kept exactly"
        if crlf:
            assert first.converted.count(b"\n") == first.converted.count(b"\r\n"), "mixed newlines"
    assert_convert_invariants(script, options)  # the str API too


@PROPERTY_SETTINGS
@given(script=st.one_of(torch_training_script(), tf1_training_script()), options=OPTIONS)
def test_training_code_is_never_silently_left_alone(script, options):
    """A script with an optimizer step is converted, already mixed precision, or warned about:
    never "not applicable" with no warning (the worst bug: a script left in fp32 silently)."""
    if "tensorflow" not in script and options.backend == "apex":
        options = Options()  # apex is its own transform; native is the default users get
    conversion = convert_source(script, options, filename="train.py")
    warned = any(f.severity is not Severity.INFO for f in conversion.findings)
    assert conversion.status in (
        FileStatus.CHANGED, FileStatus.CHANGED_INCOMPLETE, FileStatus.ALREADY_MIXED_PRECISION, FileStatus.UNCONVERTED
    ) or warned, f"{conversion.status.value}: {conversion.reason}\n{script}"


@PROPERTY_SETTINGS
@given(program=hypothesmith.from_grammar())
def test_import_map_never_raises_on_parsable_programs(program):
    """The import table is built for every parsed file, before any transform: any program LibCST
    parses must give one, and every name it maps must be a dotted path of identifiers."""
    import libcst as cst

    from ampify.transforms.kit.imports import ImportMap

    try:
        module = cst.parse_module(program)
    except (cst.ParserSyntaxError, RecursionError):
        assume(False)
    imports = ImportMap.from_module(module)
    for local, target in imports.aliases.items():
        assert local.isidentifier()
        assert all(part.isidentifier() for part in target.split(".")), target
