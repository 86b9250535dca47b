"""Facts about statements and expressions that the PyTorch rewrites ask: which names a
statement uses and binds, whether it jumps (continue/break/return), which calls it makes,
which argument a call passes for a parameter. Pure functions on LibCST nodes, no state.
"""

from __future__ import annotations

import re

from typing import Collection, Dict, List, Optional, Set

import libcst as cst

from ampify.transforms.torch import names as names
from ampify.transforms.kit.calls import calls_within  # noqa: F401  (re-exported: the torch transforms import it here)
from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import dotted_name


class _OptimizerPathRenamer(cst.CSTTransformer):
    """"optimizer.pt" -> "scaler.pt" inside the string parts of a path expression; with the
    optimizer's name, also a file named after it (`root / "optG.pt"`, descriptinc/melgan-neurips)."""

    def __init__(self, name: Optional[str] = None) -> None:
        super().__init__()
        self.renamed = False
        last = name.rsplit(".", 1)[-1] if name else ""
        #: the optimizer's name as a file name's stem or part of it: `optG.pt`, `ckpt_optG_10.pt`
        self.own_name = re.compile(rf"(?:^|(?<=[\"'/\\._-])){re.escape(last)}(?=[._\"'-]|$)") if len(last) >= 3 else None

    def _rename(self, text: str) -> str:
        for word in ("optimizer", "optimiser", "optim"):
            if word in text:
                self.renamed = True
                return text.replace(word, "scaler", 1)
        if self.own_name is not None:
            renamed = self.own_name.sub("scaler", text, count=1)
            if renamed != text:
                self.renamed = True
                return renamed
        return text

    def leave_SimpleString(self, original_node: cst.SimpleString, updated_node: cst.SimpleString) -> cst.SimpleString:
        if self.renamed:
            return updated_node
        return updated_node.with_changes(value=self._rename(updated_node.value))

    def leave_FormattedStringText(self, original_node, updated_node):
        if self.renamed:
            return updated_node
        return updated_node.with_changes(value=self._rename(updated_node.value))


def renamed_optimizer_path(path: cst.BaseExpression, name: Optional[str] = None) -> Optional[cst.BaseExpression]:
    """The path with "optimizer" (or the optimizer's own `name`) renamed to "scaler" in its string
    parts; None if it has neither."""
    renamer = _OptimizerPathRenamer(name)
    new_path = path.visit(renamer)
    return new_path if renamer.renamed else None


def code_of(node: cst.CSTNode) -> str:
    """The source text of a node."""
    return cst.Module(body=[]).code_for_node(node)


class _NameCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.used: Set[str] = set()

    def visit_Name(self, node: cst.Name) -> None:
        self.used.add(node.value)

    def visit_Attribute(self, node: cst.Attribute) -> bool:
        name = dotted_name(node)
        if name:
            self.used.add(name)
        # `data.actions` uses `data` (and the chain), not a variable named `actions`
        node.value.visit(self)
        return False


def used_names(node: cst.CSTNode) -> Set[str]:
    """Every name and dotted attribute chain that appears in node."""
    collector = _NameCollector()
    walk(node, collector)
    return collector.used


class _AssignCollector(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.assigned: Set[str] = set()

    def _add(self, target: cst.BaseExpression) -> None:
        if isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                self._add(element.value)
            return
        if isinstance(target, cst.StarredElement):
            self._add(target.value)
            return
        if isinstance(target, cst.Subscript):
            self._add(target.value)
            return
        name = dotted_name(target)
        if name:
            self.assigned.add(name)

    def visit_AssignTarget(self, node: cst.AssignTarget) -> None:
        self._add(node.target)

    def visit_AugAssign(self, node: cst.AugAssign) -> None:
        self._add(node.target)

    def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
        self._add(node.target)

    def visit_For(self, node: cst.For) -> None:
        self._add(node.target)

    def visit_WithItem(self, node: cst.WithItem) -> None:
        if node.asname is not None:
            self._add(node.asname.name)

    def visit_NamedExpr(self, node: cst.NamedExpr) -> None:
        self._add(node.target)

    def visit_FunctionDef(self, node: cst.FunctionDef) -> bool:
        return False


def assigned_names(statement: cst.CSTNode) -> Set[str]:
    """Names (and dotted chains) a statement binds, including inside its nested blocks."""
    collector = _AssignCollector()
    walk(statement, collector)
    return collector.assigned


def called_name(call: cst.Call) -> Optional[str]:
    """The name a call calls: `step` for `opt.step()`, `f` for `f(x)`; None for `fs[0](x)`, `g()(x)`."""
    func = call.func
    if isinstance(func, cst.Attribute):
        return func.attr.value
    if isinstance(func, cst.Name):
        return func.value
    return None


def has_forward_call(statement: cst.CSTNode, imports=None, data_helpers: Set[str] = frozenset()) -> bool:
    """Does the statement call something that is not mere data preparation (a model, a loss)?
    With `imports`, calls into numpy and the standard library's math and random count as data
    preparation too (`x_np = np.sin(steps)`); so do the module's own helpers in `data_helpers`
    (`mixup_data`, `self.get_torch_variable`: see data_preparation_helpers)."""
    for call in calls_within(statement):
        resolved = imports.resolve(call.func) if imports is not None else None
        if resolved is not None and (resolved.split(".")[0] in names.HOST_DATA_MODULES
                                     or resolved.startswith(names.DATA_LOADING_PREFIX)):
            continue
        called = called_name(call)
        if called is None:
            return True
        if called in names.DATA_PREPARATION_CALLS or fetches_a_batch(call, called):
            continue
        if data_helpers and dotted_name(call.func) in data_helpers:
            continue
        return True
    return False


def data_preparation_helpers(module: cst.Module, imports=None) -> Set[str]:
    """Functions of the module (`mixup_data`) and methods of its classes (`self.get_torch_variable`)
    that only prepare data: every call in them is data preparation (has_forward_call), and they
    hold no `@` product, no nested definition and no yield. A name defined more than once counts
    only when every definition qualifies. Calling one starts no forward pass, so an autocast
    region need not begin at it."""
    verdicts: Dict[str, bool] = {}

    def judge(name: str, function: cst.FunctionDef) -> None:
        verdicts[name] = verdicts.get(name, True) and _only_prepares_data(function, imports)

    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            judge(statement.name.value, statement)
        elif isinstance(statement, cst.ClassDef):
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef):
                    judge(f"self.{member.name.value}", member)
    return {name for name, fine in verdicts.items() if fine}


def _only_prepares_data(function: cst.FunctionDef, imports) -> bool:
    class _Disqualifiers(cst.CSTVisitor):
        found = False

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Yield, cst.Await)) or (
                    isinstance(node, (cst.BinaryOperation, cst.AugAssign))
                    and isinstance(node.operator, (cst.MatrixMultiply, cst.MatrixMultiplyAssign))):
                self.found = True
            return not self.found

    finder = _Disqualifiers()
    walk(function.body, finder)
    return not finder.found and not has_forward_call(function.body, imports)


def calls_model(node: cst.CSTNode, imports, model_free: Collection[str] = frozenset()) -> bool:
    """Does the node call something other than imported functions, tensor methods and builtins:
    a model, a loss module, a helper that runs them? `model_free`: the module's own functions and
    methods known to run no model (model_free_helpers), called by their name or as `self.<name>`."""
    for call in calls_within(node):
        if imports.resolve(call.func) is not None:
            continue
        called = called_name(call)
        if called is None:
            return True
        if called in names.TENSOR_ARITHMETIC_CALLS or fetches_a_batch(call, called):
            continue
        if model_free and dotted_name(call.func) in model_free:
            continue
        return True
    return False


def model_free_helpers(module: cst.Module, imports) -> Dict[str, List[cst.FunctionDef]]:
    """Functions of the module and methods of its classes (as `self.<name>`) that run no model:
    every call in them is an imported function, tensor arithmetic, a batch fetch or another such
    helper (REINFORCE's `self.calculate_policy_loss_on_episode()`, which sums log-probabilities kept
    from the rollout), and none of the ops autocast runs in float16 (a model written out as
    `torch.mm(x, self.weight.T)` or `x @ w + b` is a forward pass). A helper calling itself,
    directly or not, does not qualify; a name defined more than once qualifies only when every
    definition does; nested definitions, lambdas and yields disqualify. A call to one is no forward pass: an autocast region around it alone
    puts no model under autocast."""
    definitions: Dict[str, List[cst.FunctionDef]] = {}
    for statement in module.body:
        if isinstance(statement, cst.FunctionDef):
            definitions.setdefault(statement.name.value, []).append(statement)
        elif isinstance(statement, cst.ClassDef):
            for member in statement.body.body:
                if isinstance(member, cst.FunctionDef):
                    definitions.setdefault(f"self.{member.name.value}", []).append(member)

    class _Disqualifiers(cst.CSTVisitor):
        found = False

        def on_visit(self, node: cst.CSTNode) -> bool:
            if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda, cst.Yield, cst.Await)) or (
                    isinstance(node, (cst.BinaryOperation, cst.AugAssign))
                    and isinstance(node.operator, (cst.MatrixMultiply, cst.MatrixMultiplyAssign))):
                self.found = True
            elif isinstance(node, cst.Call):
                # a model written out (`torch.mm(x, self.weight.T)`, `x @ w + b`) is a forward pass
                if called_name(node) in names.AUTOCAST_LOWER_PRECISION_OPS:
                    self.found = True
            return not self.found

    candidates: Dict[str, List[cst.FunctionDef]] = {}
    for name, functions in definitions.items():
        plain = True
        for function in functions:
            finder = _Disqualifiers()
            walk(function.body, finder)
            plain = plain and not finder.found
        if plain:
            candidates[name] = functions
    # least fixed point: a helper qualifies once every helper it calls has
    free: Dict[str, List[cst.FunctionDef]] = {}
    changed = True
    while changed:
        changed = False
        for name, functions in candidates.items():
            if name not in free and not any(calls_model(f.body, imports, free.keys()) for f in functions):
                free[name] = functions
                changed = True
    return free


def assigned_self_attributes(module: cst.Module) -> Set[str]:
    """Names X of the module's `self.X = ...` (also annotated and augmented) assignments."""
    found: Set[str] = set()

    def note(target: cst.BaseExpression) -> None:
        if isinstance(target, cst.Attribute) and isinstance(target.value, cst.Name) and target.value.value == "self":
            found.add(target.attr.value)
        elif isinstance(target, (cst.Tuple, cst.List)):
            for element in target.elements:
                note(element.value)

    class _Collector(cst.CSTVisitor):
        def visit_Assign(self, node: cst.Assign) -> None:
            for target in node.targets:
                note(target.target)

        def visit_AnnAssign(self, node: cst.AnnAssign) -> None:
            note(node.target)

        def visit_AugAssign(self, node: cst.AugAssign) -> None:
            note(node.target)

    walk(module, _Collector())
    return found


def fetches_a_batch(call: cst.Call, method: str) -> bool:
    """`replay_buffer.sample(n)`, `train_dataset.get_batch()`: a batch fetched from a data source."""
    if method not in names.DATA_SOURCE_METHODS or not isinstance(call.func, cst.Attribute):
        return False
    receiver = call.func.value
    if isinstance(receiver, cst.Call) and not receiver.args and isinstance(receiver.func, cst.Attribute) \
            and receiver.func.attr.value == "__iter__":
        receiver = receiver.func.value  # `loader.__iter__().next()`
    last = receiver.attr.value if isinstance(receiver, cst.Attribute) else receiver.value if isinstance(receiver, cst.Name) else ""
    return any(word in last.lower() for word in names.DATA_SOURCE_WORDS) or last.lower() in names.DATA_SOURCE_NAMES


class _JumpFinder(cst.CSTVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.found: Optional[cst.CSTNode] = None
        self.loop_depth = 0

    def on_visit(self, node: cst.CSTNode) -> bool:
        if self.found is not None:
            return False
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Lambda)):
            return False
        if isinstance(node, (cst.For, cst.While)):
            self.loop_depth += 1
        if isinstance(node, (cst.Continue, cst.Break)) and self.loop_depth == 0:
            self.found = node
        if isinstance(node, cst.Return):
            self.found = node
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if isinstance(original_node, (cst.For, cst.While)):
            self.loop_depth -= 1


def find_jump(statement: cst.CSTNode) -> Optional[cst.CSTNode]:
    """A continue/break (of the enclosing loop) or return inside statement, if any."""
    finder = _JumpFinder()
    if isinstance(statement, (cst.For, cst.While)):
        # jumps inside a nested loop's body belong to that loop; only its else-block matters
        if statement.orelse is not None:
            walk(statement.orelse, finder)
        return finder.found
    walk(statement, finder)
    return finder.found


def all_params(function: cst.FunctionDef) -> List[cst.Param]:
    """Every parameter of a function, *args and **kwargs included."""
    params = function.params
    found = list(params.posonly_params) + list(params.params) + list(params.kwonly_params)
    for extra in (params.star_arg, params.star_kwarg):
        if isinstance(extra, cst.Param):
            found.append(extra)
    return found


def parameter_positions(function: cst.FunctionDef) -> Dict[str, int]:
    """Positional index of each parameter that can be passed by position."""
    params = list(function.params.posonly_params) + list(function.params.params)
    return {p.name.value: index for index, p in enumerate(params)}


def argument_for(call: cst.Call, parameter: str, positions: Dict[str, int]) -> Optional[cst.BaseExpression]:
    """The expression a call passes for `parameter` (by keyword or position), if it can be told."""
    for arg in call.args:
        if arg.keyword is not None and arg.keyword.value == parameter:
            return arg.value
    index = positions.get(parameter)
    if index is None:
        return None
    positional = [a for a in call.args if a.keyword is None]
    if any(a.star for a in positional[: index + 1]):
        return None
    if index < len(positional):
        return positional[index].value
    return None


def string_subscript(node: Optional[cst.BaseExpression]) -> Optional[cst.SimpleString]:
    """The string key of `base["key"]`, else None."""
    if isinstance(node, cst.Subscript) and len(node.slice) == 1:
        element = node.slice[0].slice
        if isinstance(element, cst.Index) and isinstance(element.value, cst.SimpleString):
            if dotted_name(node.value) is not None:
                return element.value
    return None


def nodes_of_type(node: cst.CSTNode, kind: type) -> List[cst.CSTNode]:
    """Every node of one type inside node (node included), in source order; nested function
    and class bodies included."""
    found: List[cst.CSTNode] = []

    class _Find(cst.CSTVisitor):
        def on_visit(self, visited: cst.CSTNode) -> bool:
            if isinstance(visited, kind):
                found.append(visited)
            return True

    walk(node, _Find())
    return found


#: list methods that add to the list they are called on (`losses.append(loss)`, `returns.appendleft(R)`)
FILLING_METHODS = {"append", "extend", "insert", "appendleft", "extendleft"}


def filled_container(call: cst.Call) -> Optional[str]:
    """`policy.saved_log_probs` for `policy.saved_log_probs.append(x)` (and for
    `self.saved[ob_id].append(x)`: the list of lists); None when the call fills no named list."""
    func = call.func
    if not isinstance(func, cst.Attribute) or func.attr.value not in FILLING_METHODS:
        return None
    receiver = func.value
    while isinstance(receiver, cst.Subscript):
        receiver = receiver.value
    return dotted_name(receiver)


def filled_containers(statement: cst.CSTNode) -> Set[str]:
    """Names (and dotted chains) of the lists a statement adds to, nested blocks included:
    `for x, y in batches: losses.append(criterion(model(x), y))` fills `losses`."""
    found = set()
    for call in calls_within(statement):
        name = filled_container(call)
        if name:
            found.add(name)
    return found


def short_text(text: str, limit: int = 60) -> str:
    """`text` on one line, cut to `limit` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
