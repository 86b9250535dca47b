"""TF1: an optimizer built inline where it applies gradients of tf.gradients.

pemami4911/deep-rl's DDPG actor (copied into many TF1 DDPG implementations):

    self.unnormalized_actor_gradients = tf.gradients(self.scaled_out, self.network_params, -self.action_gradient)
    self.actor_gradients = list(map(lambda x: tf.div(x, self.batch_size), self.unnormalized_actor_gradients))
    self.optimize = tf.train.AdamOptimizer(self.learning_rate).apply_gradients(zip(self.actor_gradients, self.network_params))

The gradients rewrite (gradients_rewrite.py) computes such gradients with the optimizer's own
compute_gradients, which scales the loss, but it needs the optimizer under a name it can move
above tf.gradients. The optimizer is first given one, on a line of its own just before:

    optimizer = tf.train.AdamOptimizer(self.learning_rate)
    self.optimize = optimizer.apply_gradients(zip(self.actor_gradients, self.network_params))

and the module is converted from there (graph_rewrite.py keeps this only when it lets the rewrite
scale those gradients)."""

from __future__ import annotations

from typing import List, Set

import libcst as cst

from ampify.transforms.kit.fast_walk import iter_tree


def name_inline_optimizers(module: cst.Module, constructor_ids: Set[int]) -> cst.Module:
    """`module` with every `<ctor>(...).apply_gradients(...)` whose constructor call's id is in
    `constructor_ids` split into a named optimizer and the apply; the module itself when none."""
    used = {node.value for node in iter_tree(module) if isinstance(node, cst.Name)}
    return module.visit(_Namer(constructor_ids, used))


class _Namer(cst.CSTTransformer):
    def __init__(self, constructor_ids: Set[int], used: Set[str]) -> None:
        self.constructor_ids = constructor_ids
        self.used = used

    def _fresh(self) -> str:
        name, counter = "optimizer", 1
        while name in self.used:
            counter += 1
            name = f"optimizer_{counter}"
        self.used.add(name)
        return name

    def _split(self, originals, statements) -> List:
        """The block's statements, each line holding an inline optimizer's apply split in two (read
        on the original statements, whose nodes the constructor ids name)."""
        out: List = []
        for original, statement in zip(originals, statements):
            inline = _inline_apply(original, self.constructor_ids) if isinstance(original, cst.SimpleStatementLine) else None
            if inline is None:
                out.append(statement)
                continue
            statement = original
            apply_call, constructor = inline
            name = self._fresh()
            out.append(cst.SimpleStatementLine(
                body=[cst.Assign(targets=[cst.AssignTarget(cst.Name(name))], value=constructor)],
                leading_lines=statement.leading_lines))
            renamed = statement.deep_replace(apply_call.func, cst.Attribute(value=cst.Name(name), attr=cst.Name("apply_gradients")))
            out.append(renamed.with_changes(leading_lines=[]))
        return out

    def leave_IndentedBlock(self, original_node, updated_node):
        return updated_node.with_changes(body=self._split(original_node.body, updated_node.body))

    def leave_Module(self, original_node, updated_node):
        return updated_node.with_changes(body=self._split(original_node.body, updated_node.body))


def _inline_apply(statement: cst.SimpleStatementLine, constructor_ids: Set[int]):
    """(the apply_gradients call, the constructor call) for a one-statement line holding
    `<ctor>(...).apply_gradients(...)`, else None."""
    if len(statement.body) != 1:
        return None
    for node in iter_tree(statement):
        if (isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "apply_gradients"
                and isinstance(node.func.value, cst.Call) and id(node.func.value) in constructor_ids):
            return node, node.func.value
    return None
