"""`masked_fill(mask, -1e9)` before a softmax, made float16-safe: the fill value becomes the
lowest number of the scores' own dtype.

Attention code masks its scores with a huge negative constant and takes a softmax:

    attn = attn.masked_fill(mask == 0, -1e9)
    attn = self.dropout(F.softmax(attn, dim=-1))

Under autocast (or apex O1) the scores are float16, and masked_fill raises `value cannot be
converted to type c10::Half without overflow` (apex does not patch masked_fill either). The fix
Hugging Face transformers uses everywhere is `torch.finfo(attn.dtype).min`: -65504 in float16,
-3.4e38 in float32. Before a softmax both constants give exactly the same probabilities: a
masked entry's exp(fill - max) is 0.0 in float32 either way, and a row masked everywhere is
uniform either way (softmax subtracts the row's maximum first). So the rewrite changes nothing in
float32 and makes the float16 step run.

Only when the filled tensor is read by a softmax and by nothing else: the fill is the softmax's
input (`F.softmax(x.masked_fill(...))`, `x.masked_fill(...).softmax(-1)`), or it is bound to a name
(or filled in place, `scores.masked_fill_(...)`, on a tensor the function computed itself) whose
every later read in the function, up to the statement that binds the name again, is a softmax's
input: `F.softmax` / `torch.softmax`, the method form, or an `nn.Softmax` module (an attribute of
the class, or built inline). A log-softmax keeps the fill in its output (fill minus log-sum-exp),
so it is accepted only for a fill that already was float32's minimum. Scaled, added to, returned, or read in a loop that may come back
to it: not followed, and the file keeps its AMP213 / AMP313 warning (a larger magnitude could
overflow to -inf there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Set, Tuple

import libcst as cst

from ampify.transforms.base import CompanionChange
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.positions import Positions
from ampify.transforms.torch import names as names
from ampify.transforms.torch.companion_modules import ModuleRewrite, plan_companion_rewrites
from ampify.transforms.torch.training_loop import numeric_value

_SOFTMAX_FUNCTIONS = {"torch.softmax", "torch.nn.functional.softmax", "torch.special.softmax"}
_SOFTMAX_METHODS = {"softmax"}
_SOFTMAX_MODULES = {"torch.nn.Softmax"}
#: a log-softmax gives the masked entries the fill minus the row's log-sum-exp: -1e9 and the
#: dtype minimum differ there, so only a fill that already was float32's minimum (the same value
#: in float32) may feed one
_LOG_SOFTMAX_FUNCTIONS = {"torch.log_softmax", "torch.nn.functional.log_softmax", "torch.special.log_softmax"}
_LOG_SOFTMAX_METHODS = {"log_softmax"}
_LOG_SOFTMAX_MODULES = {"torch.nn.LogSoftmax"}
#: calls that return a new tensor (never a view of their input): a fill in place on their result
#: touches nothing else
_FRESH_CALLS = {"torch.matmul", "torch.bmm", "torch.einsum", "torch.baddbmm"}
_FRESH_METHODS = {"matmul", "bmm"}


@dataclass
class FillLimits:
    """The rewritten module and the lines (of the module before) whose fill value changed."""

    module: cst.Module
    #: (line, column, old value, new value) of each rewritten constant
    rewritten: List[Tuple[int, int, str, str]] = field(default_factory=list)

    def describe(self, display: str = "") -> str:
        where = f"{display}:" if display else "line "
        shown = ", ".join(f"{where}{line} {old} -> {new}" for line, _, old, new in self.rewritten)
        return (f"masked_fill before a softmax ({shown}): the constant overflows float16 and masked_fill would raise "
                "on float16 scores; the scores' own dtype minimum gives the same probabilities in float32 (masked "
                "entries still get exactly 0)")


class _NotSafe(Exception):
    pass


def float16_safe_fills(module: cst.Module, imports: ImportMap) -> Optional[FillLimits]:
    """The module with every float16-overflowing masked_fill constant replaced, or None when
    there is none or one of them is not read by a softmax only (then nothing is rewritten)."""
    try:
        return _Rewriter(module, imports).run()
    except _NotSafe:
        return None
    except (IndexError, AttributeError, KeyError, TypeError):
        return None  # a shape not foreseen: nothing rewritten, the warning stands


#: the last part of a name that holds a dimension (at least 1): `d_k`, `self.head_dim`, `embed_size`
_DIMENSION_NAME = re.compile(r"(^d$|^d_|dim|size|head|embed|hidden|channel|feature|width|^n_|units)", re.IGNORECASE)


def _is_dimension(node: cst.BaseExpression) -> bool:
    """A number >= 1, a name or attribute named like a dimension, `x.size(-1)`, `x.shape[-1]`."""
    value = numeric_value(node)
    if value is not None:
        return value >= 1
    if isinstance(node, (cst.Name, cst.Attribute)):
        last = node.value if isinstance(node, cst.Name) else node.attr.value
        return bool(_DIMENSION_NAME.search(last))
    if isinstance(node, cst.Call) and isinstance(node.func, cst.Attribute) and node.func.attr.value == "size":
        return len(node.args) == 1
    if isinstance(node, cst.Subscript) and isinstance(node.value, cst.Attribute) and node.value.attr.value == "shape":
        return True
    return False


def overflowing_fill_value(call: cst.Call, imports: ImportMap) -> Optional[cst.Arg]:
    """The argument of a masked_fill call whose constant lies beyond float16 (finite), or None."""
    func = call.func
    if not (isinstance(func, cst.Attribute) and func.attr.value in ("masked_fill", "masked_fill_")):
        return None
    qualified = imports.resolve(func)
    position = 2 if qualified == "torch.masked_fill" else 1
    for index, arg in enumerate(call.args):
        keyword = arg.keyword.value if arg.keyword is not None else None
        if keyword == "value" or (keyword is None and index == position):
            value = numeric_value(arg.value)
            if value is not None and names.FLOAT16_MAX < abs(value) < float("inf"):
                return arg
            if _is_wide_finfo_limit(arg.value, imports):
                return arg
            return None
    return None


class _Rewriter:
    def __init__(self, module: cst.Module, imports: ImportMap) -> None:
        self.module = module
        self.imports = imports
        self.parents: Dict[int, cst.CSTNode] = {}
        self.calls: List[cst.Call] = []
        self.log_softmax_allowed = False
        self._index()
        self.positions = Positions(module)

    def _index(self) -> None:
        parents = self.parents
        calls = self.calls

        class _Index(cst.CSTVisitor):
            def on_visit(self, node: cst.CSTNode) -> bool:
                for child in node.children:
                    parents[id(child)] = node
                if isinstance(node, cst.Call):
                    calls.append(node)
                return True

        walk(self.module, _Index())

    def parent(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        return self.parents.get(id(node))

    def ancestors(self, node: cst.CSTNode):
        current = self.parent(node)
        while current is not None:
            yield current
            current = self.parent(current)

    def run(self) -> Optional[FillLimits]:
        torch_names = sorted(self.imports.local_names_for("torch"))
        replacements: Dict[int, cst.BaseExpression] = {}
        found: List[Tuple[int, int, str, str]] = []
        for call in self.calls:
            arg = overflowing_fill_value(call, self.imports)
            if arg is None:
                continue
            if not _is_negative(arg.value):
                raise _NotSafe("a positive fill is not a mask before a softmax")
            if not torch_names:
                raise _NotSafe("torch is not imported by name")
            receiver = self._receiver(call)
            if numeric_value(arg.value) is None and not _is_float32_limit(arg.value, self.imports):
                raise _NotSafe("float64's limit is -inf in float32: changing it changes rows masked everywhere")
            self.log_softmax_allowed = numeric_value(arg.value) is None  # float32's own minimum
            self._check_read_by_softmax_only(call, receiver)
            limit = cst.Attribute(
                value=cst.Call(
                    func=cst.Attribute(value=cst.Name(torch_names[0]), attr=cst.Name("finfo")),
                    args=[cst.Arg(cst.Attribute(value=receiver.deep_clone(), attr=cst.Name("dtype")))],
                ),
                attr=cst.Name("min"),
            )
            replacements[id(arg.value)] = limit
            start = self.positions[arg.value].start
            found.append((start.line, start.column, self.module.code_for_node(arg.value),
                          self.module.code_for_node(limit)))
        if not replacements:
            return None
        return FillLimits(self.module.visit(_Replace(replacements)), found)

    def _receiver(self, call: cst.Call) -> cst.BaseExpression:
        """The tensor filled: `x` of `x.masked_fill(...)` or of `torch.masked_fill(x, ...)`."""
        func = call.func
        if self.imports.resolve(func) == "torch.masked_fill":
            receiver = call.args[0].value
        else:
            receiver = func.value
        if not _is_plain_reference(receiver):
            raise _NotSafe("the filled tensor is an expression")
        return receiver

    # ---- where the filled tensor goes ------------------------------------------------------

    def _check_read_by_softmax_only(self, call: cst.Call, receiver: cst.BaseExpression) -> None:
        if self._softmax_input(call):
            return
        in_place = call.func.attr.value == "masked_fill_"
        parent = self.parent(call)
        statement = self.parent(parent) if parent is not None else None
        function = self._scope_of(call)
        if function is None:
            raise _NotSafe("in a class body or a lambda")
        if in_place:
            if not (isinstance(parent, cst.Expr) and isinstance(receiver, cst.Name)):
                raise _NotSafe("an in-place fill used as a value")
            name = receiver.value
            if not self._computed_fresh_before(function, name, statement):
                raise _NotSafe("an in-place fill on a tensor the function did not compute")
        else:
            if not (isinstance(parent, cst.Assign) and len(parent.targets) == 1
                    and isinstance(parent.targets[0].target, cst.Name)):
                raise _NotSafe("the filled tensor is not bound to a name")
            name = parent.targets[0].target.value
        if not isinstance(statement, cst.SimpleStatementLine) or len(statement.body) != 1:
            raise _NotSafe("a statement shared with others")
        for loop in self._ancestors_within(statement, function):
            if isinstance(loop, (cst.For, cst.While)):
                self._bound_afresh_each_pass(loop, statement, name)
        self._later_reads_are_softmax_inputs(function, statement, name)

    def _scope_of(self, node: cst.CSTNode) -> Optional[cst.CSTNode]:
        """The function the node runs in, or the module for a script's top level."""
        for ancestor in self.ancestors(node):
            if isinstance(ancestor, (cst.FunctionDef, cst.Module)):
                return ancestor
            if isinstance(ancestor, (cst.ClassDef, cst.Lambda)):
                return None
        return None

    def _bound_afresh_each_pass(self, loop: cst.CSTNode, statement: cst.CSTNode, name: str) -> None:
        """In a loop, the filled tensor of one pass must not be read by the next: `name` is bound,
        in a block enclosing the fill, before the fill, from an expression that does not read it,
        and nothing in the loop reads it before that binding."""
        enclosing = {id(b) for b in self._ancestors_within(statement, loop)}
        occurrences = sorted(self._names(loop, name)[0], key=self._start)
        for node in occurrences:
            if self._start(node) >= self._start(statement):
                break
            line = next(a for a in self.ancestors(node) if isinstance(a, cst.SimpleStatementLine))
            small = line.body[0] if len(line.body) == 1 else None
            if (isinstance(small, cst.Assign) and len(small.targets) == 1 and small.targets[0].target is node
                    and id(self.parent(line)) in enclosing
                    and not self._names(small.value, name)[0]):
                return
            break
        raise _NotSafe("in a loop whose next pass may read the filled tensor")

    def _start(self, node: cst.CSTNode) -> Tuple[int, int]:
        start = self.positions[node].start
        return start.line, start.column

    def _names(self, node: cst.CSTNode, name: str) -> Tuple[List[cst.Name], Set[int]]:
        return _names_in(node, name)

    def _ancestors_within(self, node: cst.CSTNode, function: cst.FunctionDef):
        for ancestor in self.ancestors(node):
            if ancestor is function:
                return
            yield ancestor

    def _softmax_input(self, node: cst.CSTNode) -> bool:
        """Is `node` the input of a softmax: its first positional argument (or `input=` / `x=`),
        the receiver of `.softmax(...)`, or the argument of an nn.Softmax attribute of the class?"""
        parent = self.parent(node)
        if (isinstance(parent, cst.BinaryOperation) and isinstance(parent.operator, cst.Divide) and parent.left is node
                and self._positive_scale(parent.right)):
            # `torch.softmax(energy / (self.embed_size ** (1 / 2)), dim=3)`: a division by a positive
            # scale keeps the masked entries the row's smallest by far (and exactly 0 after the softmax)
            return self._softmax_input(parent)
        functions, methods, modules = self._softmaxes()
        if isinstance(parent, cst.Attribute) and parent.value is node and parent.attr.value in methods:
            return isinstance(self.parent(parent), cst.Call) and self.parent(parent).func is parent
        if not isinstance(parent, cst.Arg) or parent.value is not node or parent.star:
            return False
        call = self.parent(parent)
        if not isinstance(call, cst.Call):
            return False
        positional = [a for a in call.args if a.keyword is None]
        first = (parent.keyword is None and positional and positional[0] is parent) or (
            parent.keyword is not None and parent.keyword.value in ("input", "x"))
        if not first:
            return False
        if self.imports.resolve(call.func) in functions:
            return True
        if len(call.args) != 1:
            return False
        if isinstance(call.func, cst.Call):  # `nn.Softmax(dim=-1)(scores)`
            return self.imports.resolve(call.func.func) in modules
        return self._softmax_attribute(call.func, modules)

    def _positive_scale(self, node: cst.BaseExpression) -> bool:
        """A divisor of at least 1, so that the fill stays finite (dividing the float32 or float16
        minimum by 0.5 would give -inf, and a row masked everywhere NaN): a number >= 1, the square
        root of a dimension (`self.embed_size ** (1 / 2)`, `math.sqrt(d_k)`, `q.size(-1) ** 0.5`),
        or a product of such."""
        value = numeric_value(node)
        if value is not None:
            return value >= 1
        if isinstance(node, cst.BinaryOperation):
            if isinstance(node.operator, cst.Power):
                exponent = numeric_value(node.right)
                if exponent is None and isinstance(node.right, cst.BinaryOperation) and isinstance(node.right.operator, cst.Divide):
                    top, bottom = numeric_value(node.right.left), numeric_value(node.right.right)
                    exponent = top / bottom if top is not None and bottom else None
                return exponent == 0.5 and _is_dimension(node.left)
            if isinstance(node.operator, cst.Multiply):
                return self._positive_scale(node.left) and self._positive_scale(node.right)
            return False
        if isinstance(node, cst.Call) and len(node.args) == 1 and node.args[0].keyword is None:
            return (self.imports.resolve(node.func) in ("math.sqrt", "numpy.sqrt")
                    and _is_dimension(node.args[0].value))
        return False

    def _softmaxes(self) -> Tuple[Set[str], Set[str], Set[str]]:
        if self.log_softmax_allowed:
            return (_SOFTMAX_FUNCTIONS | _LOG_SOFTMAX_FUNCTIONS, _SOFTMAX_METHODS | _LOG_SOFTMAX_METHODS,
                    _SOFTMAX_MODULES | _LOG_SOFTMAX_MODULES)
        return _SOFTMAX_FUNCTIONS, _SOFTMAX_METHODS, _SOFTMAX_MODULES

    def _softmax_attribute(self, func: cst.BaseExpression, modules: Set[str]) -> bool:
        """`self.softmax` where every assignment of that attribute in the class is nn.Softmax(...)."""
        if not (isinstance(func, cst.Attribute) and isinstance(func.value, cst.Name) and func.value.value == "self"):
            return False
        owner = next((a for a in self.ancestors(func) if isinstance(a, cst.ClassDef)), None)
        if owner is None:
            return False
        attribute = func.attr.value
        assigned: List[cst.BaseExpression] = []

        class _Assignments(cst.CSTVisitor):
            def visit_Assign(self, node: cst.Assign) -> None:
                for target in node.targets:
                    t = target.target
                    if (isinstance(t, cst.Attribute) and isinstance(t.value, cst.Name) and t.value.value == "self"
                            and t.attr.value == attribute):
                        assigned.append(node.value)

        walk(owner, _Assignments())
        return bool(assigned) and all(
            isinstance(value, cst.Call) and self.imports.resolve(value.func) in modules for value in assigned)

    def _computed_fresh_before(self, function: cst.FunctionDef, name: str, statement: cst.CSTNode) -> bool:
        """`name` was last bound, in a block enclosing `statement`, to a new tensor (arithmetic,
        matmul, bmm, einsum), so that filling it in place changes nothing else."""
        fresh = False
        for line in self._statements_before(function, statement):
            for small in line.body:
                if isinstance(small, cst.Assign) and any(
                        isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets):
                    fresh = len(small.targets) == 1 and self._is_fresh(small.value)
        return fresh

    def _is_fresh(self, value: cst.BaseExpression) -> bool:
        if isinstance(value, cst.BinaryOperation):
            return True
        if isinstance(value, cst.Call):
            if self.imports.resolve(value.func) in _FRESH_CALLS:
                return True
            return isinstance(value.func, cst.Attribute) and value.func.attr.value in _FRESH_METHODS
        return False

    def _statements_before(self, function: cst.CSTNode, statement: cst.CSTNode) -> List[cst.SimpleStatementLine]:
        """Simple statement lines in the blocks enclosing `statement` (up to the function's
        body, or the module), that come before it, in order."""
        chain = [statement] + list(self._ancestors_within(statement, function))
        lines: List[cst.SimpleStatementLine] = []
        for child, block in zip(chain, chain[1:] + [function]):
            if isinstance(block, (cst.IndentedBlock, cst.Module)):
                before = []
                for item in block.body:
                    if item is child:
                        break
                    if isinstance(item, cst.SimpleStatementLine):
                        before.append(item)
                lines = before + lines
        return lines

    def _later_reads_are_softmax_inputs(self, function: cst.FunctionDef, statement: cst.CSTNode, name: str) -> None:
        """Every read of `name` after `statement` is a softmax's input, until a statement in a
        block enclosing `statement` binds the name again."""
        enclosing = {id(b) for b in self._ancestors_within(statement, function) if isinstance(b, cst.IndentedBlock)}
        enclosing.add(id(function.body) if isinstance(function, cst.FunctionDef) else id(function))
        after = self.positions[statement].end
        reads, stores = self._names(function, name)

        ordered = sorted(
            (n for n in reads if (self.positions[n].start.line, self.positions[n].start.column) > (after.line, after.column)),
            key=lambda n: (self.positions[n].start.line, self.positions[n].start.column),
        )
        for node in ordered:
            if id(node) in stores:
                line = next(a for a in self.ancestors(node) if isinstance(a, cst.SimpleStatementLine))
                if id(self.parent(line)) not in enclosing:
                    raise _NotSafe("bound again in a branch")
                # `attn = F.softmax(attn, -1)`: its own reads come before the new binding
                if any(self._in(n, line) and id(n) not in stores and not self._softmax_input(n) for n in ordered):
                    raise _NotSafe(f"{name} is read by something other than a softmax")
                return  # bound again on every path from here on
            if not self._softmax_input(node):
                raise _NotSafe(f"{name} is read by something other than a softmax")
        if not ordered:
            raise _NotSafe("the filled tensor is never read here")


    def _in(self, node: cst.CSTNode, container: cst.CSTNode) -> bool:
        return any(a is container for a in self.ancestors(node))


class _Replace(cst.CSTTransformer):
    def __init__(self, replacements: Dict[int, cst.BaseExpression]) -> None:
        super().__init__()
        self.replacements = replacements

    def on_leave(self, original_node, updated_node):
        replacement = self.replacements.get(id(original_node))
        return replacement if replacement is not None else updated_node


def _names_in(root: cst.CSTNode, name: str) -> Tuple[List[cst.Name], Set[int]]:
    """The Name nodes spelling `name` under `root` (an attribute's or a keyword's name is no
    read of it), and the ids of those that are assignment targets."""
    reads: List[cst.Name] = []
    stores: Set[int] = set()

    class _Names(cst.CSTVisitor):
        def visit_Attribute(self, node: cst.Attribute) -> bool:
            node.value.visit(self)  # `self.attn`: the attribute's name is no read of `attn`
            return False

        def visit_Arg(self, node: cst.Arg) -> bool:
            node.value.visit(self)  # `dim=-1`: a keyword is no read either
            return False

        def visit_Name(self, node: cst.Name) -> None:
            if node.value == name:
                reads.append(node)

        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                if isinstance(target.target, cst.Name) and target.target.value == name:
                    stores.add(id(target.target))

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            if isinstance(node.target, cst.Name) and node.target.value == name:
                stores.add(id(node.target))

    walk(root, _Names())
    return reads, stores


def _has_overflowing_fill(module: cst.Module, imports: ImportMap) -> bool:
    found = False

    class _Calls(cst.CSTVisitor):
        def visit_Call(self, node: cst.Call) -> None:
            nonlocal found
            found = found or overflowing_fill_value(node, imports) is not None

    walk(module, _Calls())
    return found


def _is_plain_reference(node: cst.BaseExpression) -> bool:
    while isinstance(node, cst.Attribute):
        node = node.value
    return isinstance(node, cst.Name)


def _is_negative(node: cst.BaseExpression) -> bool:
    """-1e9, float("-1e9"), torch.finfo(torch.float32).min, -torch.finfo(torch.float32).max."""
    value = numeric_value(node)
    if value is not None:
        return value < 0
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return isinstance(node.expression, cst.Attribute) and node.expression.attr.value == "max"
    return isinstance(node, cst.Attribute) and node.attr.value == "min"


def _is_float32_limit(node: cst.BaseExpression, imports: ImportMap) -> bool:
    if isinstance(node, cst.UnaryOperation):
        node = node.expression
    dtype = imports.resolve(node.value.args[0].value) or ""
    return dtype.rsplit(".", 1)[-1] in ("float32", "float", "single")


def _is_wide_finfo_limit(node: cst.BaseExpression, imports: ImportMap) -> bool:
    """`-torch.finfo(torch.float32).max` / `torch.finfo(torch.float).min` (or numpy's): beyond float16."""
    if isinstance(node, cst.UnaryOperation) and isinstance(node.operator, cst.Minus):
        return _is_wide_finfo_limit(node.expression, imports) and node.expression.attr.value == "max"
    if not (isinstance(node, cst.Attribute) and node.attr.value in ("min", "max")):
        return False
    call = node.value
    if not (isinstance(call, cst.Call) and call.args):
        return False
    if imports.resolve(call.func) not in ("torch.finfo", "numpy.finfo"):
        return False
    dtype = imports.resolve(call.args[0].value) or ""
    return dtype.rsplit(".", 1)[-1] in names.WIDE_FLOAT_DTYPES


def plan_imported_fill_limits(project, here: str) -> Tuple[List[CompanionChange], List[str], Optional[str]]:
    """The training module `here` imports attention code with `masked_fill(mask, -1e9)`: each such
    module gets its fill constants rewritten, as companions of this module's change (one change
    set). Returns (companions, one line per rewrite for this module's report, None), or
    ([], [], the reason it cannot be done)."""

    def rewrite(key: str, display: str, source: bytes, module: cst.Module):
        imports = ImportMap.from_module(module)
        limited = float16_safe_fills(module, imports)
        if limited is None and not _has_overflowing_fill(module, imports):
            return None  # rewritten already, by the change set of another training file of this run
        if limited is None:
            return (f"in {display} the filled scores are read by more than a softmax, so ampify cannot tell "
                    "that a smaller constant changes nothing; use torch.finfo(scores.dtype).min there by hand")
        line, column = limited.rewritten[0][:2]
        return ModuleRewrite(limited.module, line, limited.describe(), limited.describe(display), column)

    return plan_companion_rewrites(
        project, here, project.float16_overflow_modules(), rewrite, "AMP232",
        "its masked_fill constants became the scores' dtype minimum, so that the float16 forward pass of that "
        "training step runs")
