"""`visit_only` gives what a full `module.visit` gives, for a transformer that changes only the
nodes it is told about, and hands every other subtree back as the same objects."""

from __future__ import annotations

import libcst as cst

from ampify.transforms.kit.fast_walk import iter_tree
from ampify.transforms.kit.pruned_visit import visit_only

SOURCE = """\
import torch

def train(model, loader):
    for x, y in loader:
        loss = model(x).sum()  # keep this comment
        loss.backward()
        if x: optimizer.step()

def evaluate(model):
    return model(1)
"""


class _RenameCalls(cst.CSTTransformer):
    """Renames the called names of the calls in `targets`; a leave hook that would change every
    other call too if it were called on it (so a pruned visit must not call it there)."""

    def __init__(self, targets) -> None:
        super().__init__()
        self.targets = targets
        self.left = []

    def leave_Call(self, original_node: cst.Call, updated_node: cst.Call) -> cst.Call:
        self.left.append(original_node)
        if id(original_node) in self.targets and isinstance(updated_node.func, cst.Name):
            return updated_node.with_changes(func=cst.Name("renamed"))
        return updated_node


def _calls(module: cst.Module):
    return [node for node in iter_tree(module) if isinstance(node, cst.Call)]


def test_the_same_code_as_a_full_visit_and_the_untouched_subtrees_are_the_same_objects():
    module = cst.parse_module(SOURCE)
    target = next(call for call in _calls(module) if cst.Module([]).code_for_node(call) == "model(x)")
    full = module.visit(_RenameCalls({id(target)}))
    transformer = _RenameCalls({id(target)})
    pruned = visit_only(module, transformer, {id(target)})
    assert pruned.code == full.code
    assert "renamed(x).sum()  # keep this comment" in pruned.code
    assert pruned.body[0] is module.body[0]  # the import
    assert pruned.body[2] is module.body[2]  # evaluate(), which holds no target
    # hooks ran on the target and its ancestors only (`model(x).sum()` holds it); no other call was entered
    enclosing = next(call for call in _calls(module) if cst.Module([]).code_for_node(call) == "model(x).sum()")
    assert transformer.left == [target, enclosing]


def test_no_target_in_the_tree_gives_the_module_back():
    module = cst.parse_module(SOURCE)
    assert visit_only(module, _RenameCalls(set()), set()) is module
    assert visit_only(module, _RenameCalls({id(cst.Name("x"))}), {id(cst.Name("x"))}) is module
