"""masked_fill(mask, -1e9) before a softmax made float16-safe (transforms/torch/masked_fill_limits.py):
which shapes are rewritten, which are left (the AMP213/AMP313 warning stands), that the rewrite
gives exactly the float32 results of the original, and that it is what lets float16 run."""

from __future__ import annotations

import textwrap

import libcst as cst
import pytest

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.torch.masked_fill_limits import float16_safe_fills

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def _rewrite(body: str):
    module = cst.parse_module(HEADER + textwrap.dedent(body))
    return float16_safe_fills(module, ImportMap.from_module(module))


REWRITTEN = {
    "softmax after an if": """
        def attention(q, k, mask=None):
            scores = torch.matmul(q, k.transpose(-2, -1))
            if mask is not None:
                scores = scores.masked_fill(mask == 0, -1e9)
            return F.softmax(scores, dim=-1)
        """,
    "rebound by the softmax": """
        def f(attn, mask):
            attn = attn.masked_fill(mask, -1e10)
            attn = torch.softmax(attn, dim=-1)
            return attn, attn.max()
        """,
    "inside the softmax call": """
        def f(scores, mask):
            return F.softmax(scores.masked_fill(mask, float("-1e9")), -1)
        """,
    "a fresh tensor filled in place": """
        def f(q, k, mask):
            scores = torch.bmm(q, k)
            scores.masked_fill_(mask, -1e9)
            return nn.Softmax(dim=-1)(scores)
        """,
    "divided by the square root of a dimension in the softmax": """
        def f(energy, mask, embed_size):
            energy = energy.masked_fill(mask == 0, float("-1e20"))
            return torch.softmax(energy / (embed_size ** (1 / 2)), dim=3)
        """,
    "a loop that binds the scores afresh": """
        for q, mask in batches:
            scores = q @ q.transpose(1, 2)
            scores = scores.masked_fill(mask, -1e9)
            p = scores.softmax(-1)
        """,
}

LEFT = {
    "scaled after the fill": """
        def f(scores, mask):
            scores = scores.masked_fill(mask, -1e9)
            return F.softmax(scores / 0.5, dim=-1)
        """,
    "divided by the square root of a temperature (may be below 1)": """
        def f(scores, mask, temperature):
            scores = scores.masked_fill(mask, -1e9)
            return F.softmax(scores / temperature ** 0.5, dim=-1)
        """,
    "returned as well": """
        def f(scores, mask):
            scores = scores.masked_fill(mask, -1e9)
            return F.softmax(scores, dim=-1), scores
        """,
    "a log-softmax keeps the fill in its output": """
        def f(logits, mask):
            logits = logits.masked_fill(mask, -1e9)
            return F.log_softmax(logits, dim=-1)
        """,
    "a positive fill": """
        def f(scores, mask):
            scores = scores.masked_fill(mask, 1e9)
            return F.softmax(scores, dim=-1)
        """,
    "an argument filled in place (the caller's tensor)": """
        def f(scores, mask):
            scores.masked_fill_(mask, -1e9)
            return F.softmax(scores, dim=-1)
        """,
    "a view filled in place": """
        def f(x, mask):
            scores = x.view(4, 4)
            scores.masked_fill_(mask, -1e9)
            return F.softmax(scores, dim=-1)
        """,
    "rebound in a branch only": """
        def f(scores, mask, flag):
            scores = scores.masked_fill(mask, -1e9)
            if flag:
                scores = F.softmax(scores, dim=-1)
            return scores
        """,
    "a loop whose next pass reads the filled tensor": """
        def f(logits, mask):
            for step in range(3):
                logits = logits.masked_fill(mask, -1e9)
                p = torch.softmax(logits, dim=-1)
            return p
        """,
    "float64's limit (-inf in float32)": """
        def f(scores, mask):
            scores = scores.masked_fill(mask, torch.finfo(torch.float64).min)
            return F.softmax(scores, dim=-1)
        """,
    "an attribute that is not a Softmax": """
        class A(nn.Module):
            def __init__(self):
                super().__init__()
                self.norm = nn.LayerNorm(8)

            def forward(self, scores, mask):
                scores = scores.masked_fill(mask, -1e9)
                return self.norm(scores)
        """,
    "one unsafe fill leaves the others too": """
        def f(scores, mask):
            scores = scores.masked_fill(mask, -1e9)
            return F.softmax(scores, dim=-1)

        def g(scores, mask):
            scores = scores.masked_fill(mask, -1e9)
            return scores.sum()
        """,
}


@pytest.mark.parametrize("name", sorted(REWRITTEN))
def test_fills_read_by_a_softmax_alone_are_rewritten(name):
    limited = _rewrite(REWRITTEN[name])
    assert limited is not None
    assert "finfo(" in limited.module.code and "1e9" not in limited.module.code and "1e10" not in limited.module.code
    assert limited.rewritten and all(new.startswith("torch.finfo(") and new.endswith(".dtype).min")
                                     for _, _, _, new in limited.rewritten)
    compile(limited.module.code, name, "exec")


@pytest.mark.parametrize("name", sorted(LEFT))
def test_fills_read_by_anything_else_are_left(name):
    assert _rewrite(LEFT[name]) is None


torch = pytest.importorskip("torch")

ATTENTION = HEADER + textwrap.dedent("""
    def attention(query, key, value, mask):
        scores = torch.matmul(query, key.transpose(-2, -1)) / 4.0
        scores = scores.masked_fill(mask == 0, -1e9)
        return torch.matmul(F.softmax(scores, dim=-1), value)
    """)


def _attention_functions():
    module = cst.parse_module(ATTENTION)
    limited = float16_safe_fills(module, ImportMap.from_module(module))
    original, rewritten = {}, {}
    exec(compile(ATTENTION, "original", "exec"), original)
    exec(compile(limited.module.code, "rewritten", "exec"), rewritten)
    return original["attention"], rewritten["attention"]


def _inputs():
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 5, 16) for _ in range(3))
    mask = torch.ones(2, 5, 5)
    mask[:, :, 3:] = 0
    mask[1, 4, :] = 0  # a row masked everywhere: uniform attention either way
    return q, k, v, mask


def test_the_rewrite_gives_exactly_the_float32_results():
    original, rewritten = _attention_functions()
    assert torch.equal(original(*_inputs()), rewritten(*_inputs()))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_the_rewrite_runs_under_autocast_where_the_original_raises_on_float16(dtype):
    original, rewritten = _attention_functions()
    expected = original(*_inputs())
    with torch.autocast("cpu", dtype=dtype):
        if dtype is torch.float16:
            with pytest.raises(RuntimeError, match="overflow"):
                original(*_inputs())
        result = rewritten(*_inputs())
    assert result.dtype == dtype
    assert torch.allclose(result.float(), expected, atol=3e-2, rtol=3e-2)


SCALED_AFTER = HEADER + textwrap.dedent("""
    def attention(query, key, value, mask):
        energy = torch.matmul(query, key.transpose(-2, -1))
        energy = energy.masked_fill(mask == 0, float("-1e20"))
        return torch.matmul(torch.softmax(energy / (query.size(-1) ** (1 / 2)), dim=-1), value)
    """)


def test_a_fill_divided_by_the_square_root_of_the_dimension_gives_exactly_the_float32_results():
    """Aladdin Persson's attention divides the filled energy by sqrt(embed_size) inside the softmax:
    the rewritten fill, divided too, stays finite and gives the same probabilities (a row masked
    everywhere stays uniform, not NaN)."""
    module = cst.parse_module(SCALED_AFTER)
    limited = float16_safe_fills(module, ImportMap.from_module(module))
    assert limited is not None and "torch.finfo(energy.dtype).min" in limited.module.code
    original, rewritten = {}, {}
    exec(compile(SCALED_AFTER, "original", "exec"), original)
    exec(compile(limited.module.code, "rewritten", "exec"), rewritten)
    expected = original["attention"](*_inputs())
    assert torch.equal(expected, rewritten["attention"](*_inputs()))
    assert not torch.isnan(expected).any()
    with torch.autocast("cpu", dtype=torch.float16):
        result = rewritten["attention"](*_inputs())
    assert not torch.isnan(result).any() and torch.allclose(result.float(), expected, atol=3e-2, rtol=3e-2)
