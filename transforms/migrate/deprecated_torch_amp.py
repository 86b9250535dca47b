"""Find every use of the deprecated `torch.cuda.amp` / `torch.cpu.amp` APIs and plan its exact
`torch.amp` equivalent.

torch warns `FutureWarning: torch.cuda.amp.autocast(args...) is deprecated. Please use
torch.amp.autocast('cuda', args...) instead.` for `autocast`, `GradScaler`, `custom_fwd` and
`custom_bwd` of both modules. The new callables take the device first, so old positional
arguments would shift: they become keywords, never positional arguments after the device
(`torch.cuda.amp.autocast(True, torch.bfloat16)` -> `torch.amp.autocast("cuda", enabled=True,
dtype=torch.bfloat16)`).

The plan is all or nothing for a file: a use that has no exact equivalent (the class passed
around as a value, a fallback definition of `autocast` for old torch, a star import) leaves the
whole file as it was, with the line and the reason, so a file is never half on each API.

How each import form is rewritten (the references keep their spelling where the import carries
the change, so the diff stays small):

    from torch.cuda.amp import autocast as ac   ->  from torch.amp import autocast as ac
    from torch.cuda import amp                  ->  from torch import amp
    import torch.cuda.amp as tca                ->  import torch.amp as tca
    import torch.cuda.amp; torch.cuda.amp.X     ->  import torch.amp;  torch.amp.X
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence, Set, Tuple

import libcst as cst

from ampify.transforms.kit.fast_walk import walk
from ampify.transforms.kit.imports import ImportMap, dotted_name

#: deprecated module -> the device its callables meant
DEPRECATED_MODULES = {"torch.cuda.amp": "cuda", "torch.cpu.amp": "cpu"}

#: the parents of the deprecated modules, from which `amp` itself can be imported
PARENT_MODULES = {"torch.cuda": "torch.cuda.amp", "torch.cpu": "torch.cpu.amp"}


@dataclass(frozen=True)
class Signature:
    """A deprecated callable: its old positional parameters (become keywords) and how the
    device is passed to the new one (first positional argument, or the `device_type` keyword)."""

    positional: Tuple[str, ...]
    device_keyword: bool = False
    #: referenced without a call, the new class is exact (isinstance, annotations)
    class_reference_ok: bool = False
    #: used as a bare decorator (`@custom_fwd`), which the new API accepts only when called
    bare_decorator_ok: bool = False


_AUTOCAST = Signature(("enabled", "dtype", "cache_enabled"))
_GRAD_SCALER = Signature(
    ("init_scale", "growth_factor", "backoff_factor", "growth_interval", "enabled"), class_reference_ok=True
)
_CUSTOM_FWD = Signature(("fwd",), device_keyword=True, bare_decorator_ok=True)
_CUSTOM_BWD = Signature(("bwd",), device_keyword=True, bare_decorator_ok=True)

#: what each deprecated module offers that torch.amp has an exact equivalent for
MIGRATABLE: Dict[str, Dict[str, Signature]] = {
    "torch.cuda.amp": {"autocast": _AUTOCAST, "GradScaler": _GRAD_SCALER, "custom_fwd": _CUSTOM_FWD,
                       "custom_bwd": _CUSTOM_BWD},
    "torch.cpu.amp": {"autocast": _AUTOCAST, "GradScaler": _GRAD_SCALER},
}


#: the callables both APIs share, by name
AMP_CALLABLES = frozenset({"autocast", "GradScaler", "custom_fwd", "custom_bwd"})

_ATTRIBUTE_CHAIN = re.compile(rb"\b(?:cuda|cpu)\s*\.\s*amp\b")
_CURRENT_API_CHAIN = re.compile(rb"\bamp\s*\.\s*(?:autocast|GradScaler|custom_fwd|custom_bwd)\b")


def may_have_deprecated_uses(source: bytes, imports: ImportMap) -> bool:
    """Without a walk: can the module name torch.cuda.amp / torch.cpu.amp at all? Through an
    import of it, of its members or of torch.cuda / torch.cpu, or as `<torch>.cuda.amp`."""
    for qualified in imports.aliases.values():
        if deprecated_module_of(qualified) is not None or qualified in PARENT_MODULES:
            return True
    return "torch" in imports.aliases.values() and _ATTRIBUTE_CHAIN.search(source) is not None


def uses_current_api(source: bytes, imports: ImportMap) -> bool:
    """Without a walk: does the module import from torch.amp, or spell `<torch>.amp.autocast`...?"""
    if any(q == "torch.amp" or q.startswith("torch.amp.") for q in imports.aliases.values()):
        return True
    return "torch" in imports.aliases.values() and _CURRENT_API_CHAIN.search(source) is not None


def may_use_deprecated_amp(source: bytes) -> bool:
    """Byte test: every spelling of a deprecated use has "amp" and "cuda" or "cpu" in it."""
    return b"amp" in source and (b"cuda" in source or b"cpu" in source) and b"torch" in source


def deprecated_module_of(qualified: str) -> Optional[str]:
    """"torch.cuda.amp" for "torch.cuda.amp.autocast" (or the module itself), else None."""
    for module in DEPRECATED_MODULES:
        if qualified == module or qualified.startswith(module + "."):
            return module
    return None


@dataclass
class Obstacle:
    """A use with no exact torch.amp equivalent: the file is left as it was."""

    node: cst.CSTNode
    reason: str


@dataclass
class Use:
    """One migrated use: the reference, what it resolves to, and how it is rewritten."""

    node: cst.CSTNode  # the Name/Attribute chain that resolves to the deprecated callable
    module: str  # "torch.cuda.amp"
    member: str  # "autocast"
    #: the Call whose func is `node` (its arguments are rewritten), None for a class reference
    call: Optional[cst.Call] = None
    #: the Decorator whose decorator is `node` (bare `@custom_fwd`)
    decorator: Optional[cst.Decorator] = None
    #: the chain `X.cuda.amp.member` where X is torch: spelled `X.amp.member` instead
    respelled: Optional[cst.BaseExpression] = None
    #: used as a value bound to a name every call of which passes keywords only (LeeDoYup's
    #: FixMatch: `amp_cm = autocast if args.amp else nullcontext`, then `with amp_cm():`): the
    #: value becomes `(lambda **kwargs: <torch.amp member>("cuda", **kwargs))`
    keyword_value: bool = False

    @property
    def device(self) -> str:
        return DEPRECATED_MODULES[self.module]

    @property
    def old_spelling(self) -> str:
        return f"{self.module}.{self.member}"

    @property
    def new_spelling(self) -> str:
        signature = MIGRATABLE[self.module][self.member]
        if self.keyword_value:
            return f'a function passing its keywords to torch.amp.{self.member}("{self.device}", ...)'
        if self.call is None and self.decorator is None:
            return f"torch.amp.{self.member}"
        if signature.device_keyword:
            return f'torch.amp.{self.member}(device_type="{self.device}", ...)'
        return f'torch.amp.{self.member}("{self.device}", ...)'


@dataclass
class ImportEdit:
    """An import statement's rewrite: a new module path for an ImportFrom, new dotted names for
    aliases of an Import, or an `amp` alias split off a `from torch.cuda import ...`."""

    node: cst.CSTNode  # cst.Import or cst.ImportFrom
    new_module: Optional[str] = None  # ImportFrom: "torch.amp" / "torch"
    #: Import: alias index -> new dotted name
    renamed_aliases: Dict[int, str] = field(default_factory=dict)
    #: ImportFrom: alias indexes moved to a new `from torch import amp [as x]` statement
    split_aliases: List[int] = field(default_factory=list)

    def describe(self) -> str:
        """`from torch.cuda.amp import ...` -> `from torch.amp import ...`, for the finding."""
        if isinstance(self.node, cst.ImportFrom):
            old = dotted_name(self.node.module)
            if self.new_module is not None:
                return f"`from {old} import ...` -> `from {self.new_module} import ...`"
            return f"`amp` moved from `from {old} import ...` to `from torch import amp`"
        old_names = [dotted_name(self.node.names[i].name) for i in sorted(self.renamed_aliases)]
        return ", ".join(f"`import {old}` -> `import {self.renamed_aliases[i]}`"
                         for old, i in zip(old_names, sorted(self.renamed_aliases)))


@dataclass
class MigrationPlan:
    uses: List[Use] = field(default_factory=list)
    imports: List[ImportEdit] = field(default_factory=list)
    obstacles: List[Obstacle] = field(default_factory=list)
    #: a rewritten reference needs `torch` bound at module level and none is
    needs_import_torch: bool = False
    #: the module already uses the current API (torch.amp.*)
    uses_current_api: bool = False
    #: ids of every node on the way to a planned edit (a rewrite need not descend elsewhere)
    paths: Set[int] = field(default_factory=set)
    #: the reference or import that comes last in the source
    last_node: Optional[cst.CSTNode] = None


def _is_migratable_member(module: str, member: str) -> bool:
    return member in MIGRATABLE[module]


class _Survey(cst.CSTVisitor):
    """One walk: deprecated references with their parents, bindings of the names they use."""

    def __init__(self, imports: ImportMap) -> None:
        super().__init__()
        self.imports = imports
        self.module: Optional[cst.Module] = None
        self.stack: List[cst.CSTNode] = []
        #: (reference, qualified name, its ancestors nearest first)
        self.references: List[Tuple[cst.CSTNode, str, Tuple[cst.CSTNode, ...]]] = []
        self.import_nodes: List[cst.CSTNode] = []
        #: ids of the nodes on the way from the module to every reference and import
        self.paths: Set[int] = set()
        #: the last of them in source order (its position, asked first, gives all the others)
        self.last_on_path: Optional[cst.CSTNode] = None
        #: references to the current API (torch.amp.*, as the migration writes it)
        self.current_api_uses = 0
        #: names bound by something other than an import (def, class, assignment, parameter...)
        self.rebound: Dict[str, cst.CSTNode] = {}

    def on_visit(self, node: cst.CSTNode) -> bool:
        if isinstance(node, (cst.Import, cst.ImportFrom)):
            self.import_nodes.append(node)
            self._on_path(node)
            return False
        parent = self.stack[-1] if self.stack else None
        if isinstance(node, (cst.Name, cst.Attribute)):
            self._reference(node, parent)
        self._binding(node)
        self.stack.append(node)
        return True

    def on_leave(self, original_node: cst.CSTNode) -> None:
        if self.stack and self.stack[-1] is original_node:
            self.stack.pop()

    def _reference(self, node: cst.CSTNode, parent: Optional[cst.CSTNode]) -> None:
        if isinstance(parent, cst.Attribute) and (parent.value is node or parent.attr is node):
            return  # part of a longer chain (or an attribute name): the whole chain is judged
        if isinstance(node, cst.Name) and not self._is_expression_name(node, parent):
            return
        qualified = self.imports.resolve(node)
        if qualified is None:
            return
        if deprecated_module_of(qualified) is None:
            if qualified.startswith("torch.amp."):
                self.current_api_uses += 1
            return
        self.references.append((node, qualified, tuple(reversed(self.stack[-5:]))))
        self._on_path(node)

    def _on_path(self, node: cst.CSTNode) -> None:
        """Remember the node and its ancestors: the rewrite descends only into those."""
        self.last_on_path = node
        self.paths.add(id(node))
        self.paths.update(id(ancestor) for ancestor in self.stack)

    @staticmethod
    def _is_expression_name(node: cst.Name, parent: Optional[cst.CSTNode]) -> bool:
        if isinstance(parent, cst.Arg) and parent.keyword is node:
            return False
        if isinstance(parent, (cst.FunctionDef, cst.ClassDef, cst.Param)) and parent.name is node:
            return False
        return True

    def _binding(self, node: cst.CSTNode) -> None:
        names: List[cst.CSTNode] = []
        if isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Param)):
            names = [node.name]
        elif isinstance(node, cst.AssignTarget):
            names = [node.target]
        elif isinstance(node, (cst.AnnAssign, cst.AugAssign)):
            names = [node.target]
        elif isinstance(node, (cst.For, cst.CompFor)):
            names = [node.target]
        elif isinstance(node, cst.AsName):
            names = [node.name]
        for name in names:
            for leaf in _bound_names(name):
                self.rebound.setdefault(leaf.value, leaf)


def _bound_names(target: cst.CSTNode) -> List[cst.Name]:
    if isinstance(target, cst.Name):
        return [target]
    if isinstance(target, (cst.Tuple, cst.List)):
        found: List[cst.Name] = []
        for element in target.elements:
            found.extend(_bound_names(element.value))
        return found
    if isinstance(target, cst.StarredElement):
        return _bound_names(target.value)
    return []


def _head(node: cst.CSTNode) -> Optional[cst.Name]:
    while isinstance(node, cst.Attribute):
        node = node.value
    return node if isinstance(node, cst.Name) else None


def _is_class_reference_position(ancestors: Tuple[cst.CSTNode, ...]) -> bool:
    """`isinstance(x, REF)`, `isinstance(x, (A, REF))`, or an annotation: there the new class
    (the base class of the old one) is exact."""
    if ancestors and isinstance(ancestors[0], cst.Annotation):
        return True
    rest = list(ancestors)
    if len(rest) >= 2 and isinstance(rest[0], cst.Element) and isinstance(rest[1], cst.Tuple):
        rest = rest[2:]
    if len(rest) >= 2 and isinstance(rest[0], cst.Arg) and isinstance(rest[1], cst.Call):
        arg, call = rest[0], rest[1]
        return (dotted_name(call.func) in ("isinstance", "issubclass") and len(call.args) == 2
                and call.args[1] is arg and arg.keyword is None and not arg.star)
    return False


def plan_migration(module: cst.Module, imports: ImportMap, torch_aliases: Set[str]) -> MigrationPlan:
    """Every deprecated use of `module` with its rewrite, or the obstacles that stop the file."""
    survey = _Survey(imports)
    survey.module = module
    walk(module, survey)
    plan = MigrationPlan()
    for node, qualified, ancestors in survey.references:
        _plan_reference(plan, survey, node, qualified, ancestors, torch_aliases)
    for node in survey.import_nodes:
        _plan_import(plan, node)
    plan.uses_current_api = survey.current_api_uses > 0
    plan.paths = survey.paths
    plan.last_node = survey.last_on_path
    return plan


def _plan_reference(plan, survey, node, qualified, ancestors, torch_aliases) -> None:
    parent = ancestors[0] if ancestors else None
    module = deprecated_module_of(qualified)
    member = qualified[len(module) + 1:]
    head = _head(node)
    if head is not None and head.value in survey.rebound and imports_bind(survey.imports, head.value):
        plan.obstacles.append(Obstacle(
            survey.rebound[head.value],
            f"{head.value!r} is imported from {module} and also defined here (a fallback for old torch?): "
            f"torch.amp's {member or 'API'} takes the device first, which the fallback would not accept",
        ))
        return
    if not member:
        plan.obstacles.append(Obstacle(node, f"the module {module} is used as a value: only its uses can be migrated"))
        return
    if "." in member or not _is_migratable_member(module, member):
        bound_to = survey.imports.aliases.get(head.value) if head is not None else None
        if member.split(".")[0] in ("autocast_mode", "grad_scaler"):
            plan.obstacles.append(Obstacle(
                node, f"{qualified} is the deprecated class under its module path: name it as torch.amp."
                f"{member.split('.')[-1]} by hand"))
        elif bound_to == module:
            plan.obstacles.append(Obstacle(
                node, f"{qualified} is reached through `{head.value}`, which the migration would bind to torch.amp "
                "(that has no such member): migrate this file by hand"))
        # anything else (torch.cuda.amp.common's helpers) is not deprecated and stays as it is
        return
    signature = MIGRATABLE[module][member]
    use = Use(node, module, member)
    if isinstance(parent, cst.Call) and parent.func is node:
        problem = _call_problem(parent)
        if problem:
            plan.obstacles.append(Obstacle(node, f"{qualified}(...) {problem}"))
            return
        use.call = parent
    elif isinstance(parent, cst.Decorator) and parent.decorator is node and signature.bare_decorator_ok:
        use.decorator = parent
    elif not signature.device_keyword and _bound_to_keyword_calls(survey.module, node, ancestors):
        use.keyword_value = True
    elif not (signature.class_reference_ok and _is_class_reference_position(ancestors)):
        plan.obstacles.append(Obstacle(
            node,
            f"{qualified} is used as a value, not called: torch.amp.{member} takes the device "
            f"{'as device_type' if signature.device_keyword else 'as its first argument'}, which only a call can pass",
        ))
        return
    bound_to = survey.imports.aliases.get(head.value) if head is not None else None
    if bound_to is not None and deprecated_module_of(bound_to) is None:
        # the chain goes through torch (or torch.cuda): respell it without `.cuda`
        use.respelled = _respell(node, member, bound_to, torch_aliases, plan)
    plan.uses.append(use)


def _bound_to_keyword_calls(module: Optional[cst.Module], node: cst.CSTNode, ancestors) -> bool:
    """Is the reference the value (or a branch of a conditional value) of `name = ...`, and is
    every other use of `name` in the module a call passing keywords only (`with amp_cm():`)?
    Then the old callable and `lambda **kwargs: new(device, **kwargs)` are called alike."""
    if module is None:
        return False
    child: cst.CSTNode = node
    for ancestor in ancestors:
        if isinstance(ancestor, cst.IfExp) and child in (ancestor.body, ancestor.orelse):
            child = ancestor
            continue
        if isinstance(ancestor, cst.Assign) and ancestor.value is child and len(ancestor.targets) == 1 \
                and isinstance(ancestor.targets[0].target, cst.Name):
            name = ancestor.targets[0].target.value
            target = ancestor.targets[0].target
            break
        return False
    else:
        return False
    called: Set[int] = set()  # the Name of each call passing keywords only
    found = {"calls": 0, "other": 0}

    class _Uses(cst.CSTVisitor):
        def visit_Call(self, call: cst.Call) -> None:
            if isinstance(call.func, cst.Name) and call.func.value == name and not any(
                    arg.keyword is None and arg.star != "**" for arg in call.args):
                called.add(id(call.func))
                found["calls"] += 1

        def visit_Name(self, use: cst.Name) -> None:
            if use.value == name and use is not target and id(use) not in called:
                found["other"] += 1

    walk(module, _Uses())
    return found["calls"] > 0 and found["other"] == 0


def imports_bind(imports: ImportMap, local: str) -> bool:
    qualified = imports.aliases.get(local)
    return qualified is not None and (
        deprecated_module_of(qualified) is not None or qualified in PARENT_MODULES
    )


def _call_problem(call: cst.Call) -> Optional[str]:
    for arg in call.args:
        if arg.star == "*":
            return "passes *args: the positional arguments cannot be named"
    return None


def _respell(node, member, bound_to, torch_aliases, plan) -> cst.BaseExpression:
    """`X.cuda.amp.member` with X resolving to torch -> `X.amp.member`; else `<torch>.amp.member`."""
    if bound_to == "torch":
        amp_level = node.value  # X.cuda.amp
        parent_level = amp_level.value if isinstance(amp_level, cst.Attribute) else None  # X.cuda
        if isinstance(parent_level, cst.Attribute):
            return node.with_changes(value=amp_level.with_changes(value=parent_level.value))
    if torch_aliases:
        torch_name = sorted(torch_aliases)[0]
    else:
        torch_name = "torch"
        plan.needs_import_torch = True
    return cst.parse_expression(f"{torch_name}.amp.{member}")


def _plan_import(plan: MigrationPlan, node: cst.CSTNode) -> None:
    if isinstance(node, cst.ImportFrom):
        if node.relative or node.module is None:
            return
        module = dotted_name(node.module) or ""
        if module in DEPRECATED_MODULES:
            if isinstance(node.names, cst.ImportStar):
                plan.obstacles.append(Obstacle(node, f"`from {module} import *`: name the imports, then run ampify again"))
                return
            for alias in node.names:
                name = dotted_name(alias.name) or ""
                if not _is_migratable_member(module, name):
                    plan.obstacles.append(Obstacle(
                        node, f"{module}.{name} has no exact torch.amp equivalent that ampify knows: migrate it by hand"))
                    return
            plan.imports.append(ImportEdit(node, new_module="torch.amp"))
        elif module in PARENT_MODULES and not isinstance(node.names, cst.ImportStar):
            moved = [i for i, alias in enumerate(node.names) if dotted_name(alias.name) == "amp"]
            if not moved:
                return
            if len(moved) == len(node.names):
                plan.imports.append(ImportEdit(node, new_module="torch"))
            else:
                plan.imports.append(ImportEdit(node, split_aliases=moved))
        return
    renamed = {}
    for index, alias in enumerate(node.names):
        name = dotted_name(alias.name) or ""
        module = deprecated_module_of(name)
        if module is None:
            continue
        if name != module:
            plan.obstacles.append(Obstacle(node, f"`import {name}` has no torch.amp equivalent that ampify knows"))
            return
        renamed[index] = "torch.amp"
    if renamed:
        plan.imports.append(ImportEdit(node, renamed_aliases=renamed))


def rewritten_call(call: cst.Call, use: Use) -> cst.Call:
    """The call with the device added and the old positional arguments named."""
    signature = MIGRATABLE[use.module][use.member]
    device = cst.SimpleString(f'"{use.device}"')
    positional = [arg for arg in call.args if arg.keyword is None and not arg.star]
    others = [arg for arg in call.args if arg.keyword is not None or arg.star]
    args: List[cst.Arg] = []
    if signature.device_keyword:
        # custom_fwd(fwd=None, *, device_type, cast_inputs=None): `fwd` stays positional
        args.extend(positional)
        args.append(cst.Arg(device, keyword=cst.Name("device_type"),
                            equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace(""))))
    else:
        args.append(cst.Arg(device))
        for name, arg in zip(signature.positional, positional):
            args.append(arg.with_changes(
                keyword=cst.Name(name),
                equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
            ))
    args.extend(others)
    return call.with_changes(args=_with_commas(args, call.args))


def _with_commas(args: Sequence[cst.Arg], old: Sequence[cst.Arg]) -> List[cst.Arg]:
    """Commas between the arguments; the last keeps the old last argument's (trailing comma,
    comment, line break), the others take the old ones' where there were as many."""
    result = []
    for index, arg in enumerate(args):
        last = index == len(args) - 1
        if last:
            comma = old[-1].comma if old else cst.MaybeSentinel.DEFAULT
            result.append(arg.with_changes(comma=comma))
        else:
            comma = arg.comma if isinstance(arg.comma, cst.Comma) else cst.Comma(
                whitespace_after=cst.SimpleWhitespace(" "))
            result.append(arg.with_changes(comma=comma))
    return result


def bare_decorator_call(use: Use, reference: cst.BaseExpression) -> cst.Call:
    """`@custom_fwd` -> `@custom_fwd(device_type="cuda")`."""
    return cst.Call(reference, args=[cst.Arg(
        cst.SimpleString(f'"{use.device}"'), keyword=cst.Name("device_type"),
        equal=cst.AssignEqual(cst.SimpleWhitespace(""), cst.SimpleWhitespace("")),
    )])


def keyword_value(use: Use, reference: cst.BaseExpression) -> cst.BaseExpression:
    """`autocast` bound as a value -> `(lambda **kwargs: autocast("cuda", **kwargs))`."""
    code = cst.Module(body=[]).code_for_node(reference)
    return cst.parse_expression(f'(lambda **kwargs: {code}("{use.device}", **kwargs))')
