"""Keep the GradScaler's state with the optimizer's in checkpoints.

Where a script saves `optimizer.state_dict()` (in a dict literal, a `ckpt["optimizer"] = ...`
assignment, or its own file through torch.save) the scaler's state is saved next to it; where it
loads the optimizer's state, the scaler's is loaded too, guarded so that checkpoints written
before the conversion still load. Anything else is reported (AMP206) for the user to do by hand.
"""

from __future__ import annotations

from typing import Callable, Optional, Set

import libcst as cst

from ampify.transforms.torch import statements as statements
from ampify.transforms.kit.imports import ImportMap, dotted_name
from ampify.transforms.torch.edits import StatementEdits
from ampify.transforms.torch.training_loop import Scope, TrainingStructure

#: report(code, message, node)
Report = Callable[[str, str, Optional[cst.CSTNode]], None]


class CheckpointWriter:
    """Plans the checkpoint edits for one module into the shared `StatementEdits`."""

    def __init__(
        self,
        structure: TrainingStructure,
        imports: ImportMap,
        edits: StatementEdits,
        torch_name: str,
        scaler_reference: Callable[[Scope, int], Optional[str]],
        info: Report,
        warn: Report,
    ) -> None:
        self.structure = structure
        self.imports = imports
        self.edits = edits
        self.torch = torch_name
        #: how code at (scope, line) reaches the scaler, None when it cannot
        self.scaler_reference = scaler_reference
        self.info = info
        self.warn = warn
        #: scaler reference -> the optimizer whose own checkpoint file its state is saved next to
        #: (TD3 saves its critic's and its actor's optimizers to two files: one scaler, one file)
        self._sibling_saves: dict = {}

    def write(self, converted: Set[str]) -> None:
        """Extend every save and load of a converted optimizer's state (`converted` names)."""
        s = self.structure
        done_dicts: Set[int] = set()
        #: (scaler reference, checkpoint expression, block) -> the optimizer whose save got the scaler's
        saved_into: dict = {}
        for site in s.optimizer_state_saves:
            if site.receiver not in converted:
                continue
            reference = self.scaler_reference(site.scope, s.line(site.call))
            parent = s.parent(site.call)
            if reference is None:
                self.warn(
                    "AMP224",
                    f"this checkpoint saves {site.receiver}.state_dict() where the GradScaler is not reachable: "
                    "save scaler.state_dict() next to it by hand",
                    site.call,
                )
                continue
            if isinstance(parent, cst.DictElement) and isinstance(parent.key, cst.SimpleString):
                owner = s.parent(parent)
                if id(owner) in done_dicts:
                    continue
                done_dicts.add(id(owner))
                keys = {e.key.evaluated_value for e in owner.elements if isinstance(e, cst.DictElement) and isinstance(e.key, cst.SimpleString)}
                key = "scaler" if "scaler" not in keys else "grad_scaler"
                self.edits.add_dict_element(parent, key, f"{reference}.state_dict()")
                self.info("AMP206", f"checkpoint also saves {reference}.state_dict() as '{key}'", site.call)
                continue
            owner = s.parent(parent) if isinstance(parent, cst.Arg) and parent.keyword is not None else None
            if isinstance(owner, cst.Call) and isinstance(owner.func, cst.Name) and owner.func.value == "dict":
                # `state = dict(epoch=..., optimizer=optimizer.state_dict())` (barlowtwins)
                if id(owner) in done_dicts:
                    continue
                done_dicts.add(id(owner))
                keys = {a.keyword.value for a in owner.args if a.keyword is not None}
                key = "scaler" if "scaler" not in keys else "grad_scaler"
                self.edits.add_keyword(owner, key, f"{reference}.state_dict()")
                self.info("AMP206", f"checkpoint also saves {reference}.state_dict() as '{key}'", site.call)
                continue
            if isinstance(parent, cst.Assign) and len(parent.targets) == 1:
                target = parent.targets[0].target
                key_node = statements.string_subscript(target)
                statement = s.statement_of(site.call)
                if key_node is not None and isinstance(statement, cst.SimpleStatementLine):
                    base = statements.code_of(target.value)
                    quote = key_node.quote
                    group = (reference, base, id(s.block_of(statement)))
                    if group in saved_into:
                        self.info("AMP206", f"{reference}.state_dict() is saved once into {base}, with "
                                            f"{saved_into[group]}'s (one scaler steps both)", site.call)
                        continue
                    saved_into[group] = site.receiver
                    self.edits.insert_after(statement, f"{base}[{quote}scaler{quote}] = {reference}.state_dict()")
                    self.info("AMP206", f"checkpoint also saves {reference}.state_dict() as 'scaler'", site.call)
                    continue
            if self._save_to_sibling_file(site, parent, reference):
                continue
            self.warn(
                "AMP224",
                f"{site.receiver}.state_dict() is saved in a form ampify does not extend: "
                "save scaler.state_dict() next to it by hand",
                site.call,
            )
        last_loads = self._last_load_per_checkpoint(converted)
        for site in s.optimizer_state_loads:
            if site.receiver not in converted:
                continue
            later = last_loads.get(id(site.call))
            if later is not None:
                self.info("AMP206", f"the scaler state is loaded once, after {later}'s (one scaler steps both)", site.call)
                continue
            reference = self.scaler_reference(site.scope, s.line(site.call))
            statement = s.statement_of(site.call)
            argument = site.call.args[0].value if site.call.args else None
            key_node = statements.string_subscript(argument) if argument is not None else None
            simple = (
                isinstance(statement, cst.SimpleStatementLine)
                and len(statement.body) == 1
                and isinstance(statement.body[0], cst.Expr)
                and statement.body[0].value is site.call
            )
            first = self._sibling_saves.get(reference) if reference is not None else None
            if first is not None and first != site.receiver and simple and self._is_sibling_file_load(argument, site.receiver):
                self.info("AMP206", f"{reference} state is loaded once, with {first}'s (one scaler steps both)", site.call)
                continue
            if reference is not None and simple and reference not in self._sibling_saves \
                    and self._is_sibling_file_load(argument, site.receiver) and not self._saves_state_here(site.receiver):
                # the optimizer's file is written by another module (self-critical.pytorch's
                # utils.save_checkpoint): a scaler file next to it would never exist to be loaded
                self.warn("AMP224", f"{site.receiver}'s state is saved by another module, not in this file, so a "
                                    f"scaler file next to it would never exist: save {reference}.state_dict() there and "
                                    "load it here by hand", site.call)
                continue
            if reference is not None and simple and self._load_from_sibling_file(statement, argument, reference, site.receiver):
                self.info("AMP206", f"{reference} state is loaded too when its file exists", site.call)
                continue
            if reference is None or key_node is None or not simple or dotted_name(argument.value) is None:
                self.warn(
                    "AMP224",
                    f"{site.receiver}.load_state_dict(...) here: load the GradScaler's state too by hand "
                    "(scaler.load_state_dict(checkpoint['scaler']) when present)",
                    site.call,
                )
                continue
            base = statements.code_of(argument.value)
            quote = key_node.quote
            self.edits.insert_after(
                statement,
                f"if {quote}scaler{quote} in {base}:\n    {reference}.load_state_dict({base}[{quote}scaler{quote}])",
            )
            self.info("AMP206", f"{reference} state is loaded too when the checkpoint has it", site.call)

    def _last_load_per_checkpoint(self, converted: Set[str]) -> dict:
        """id(load call) -> the optimizer loaded later from the same checkpoint in the same block
        (`D_optimizer.load_state_dict(ckpt['D_optimizer'])` then `G_optimizer.load_state_dict(
        ckpt['G_optimizer'])`): the scaler's state is loaded once, after the last of them."""
        s = self.structure
        groups: dict = {}
        for site in s.optimizer_state_loads:
            if site.receiver not in converted:
                continue
            reference = self.scaler_reference(site.scope, s.line(site.call))
            statement = s.statement_of(site.call)
            argument = site.call.args[0].value if site.call.args else None
            if reference is None or statement is None or statements.string_subscript(argument) is None:
                continue
            base = statements.code_of(argument.value)
            groups.setdefault((reference, base, id(s.block_of(statement))), []).append(site)
        earlier: dict = {}
        for sites in groups.values():
            sites.sort(key=lambda site: s.line(site.call))
            for site in sites[:-1]:
                earlier[id(site.call)] = sites[-1].receiver
        return earlier

    def _save_to_sibling_file(self, site, parent: Optional[cst.CSTNode], reference: str) -> bool:
        """`torch.save(optimizer.state_dict(), ".../optimizer.pt")`: save the scaler next to it,
        in a file named like the optimizer's with "scaler" for "optimizer"."""
        s = self.structure
        call = s.parent(parent) if isinstance(parent, cst.Arg) else None
        if not isinstance(call, cst.Call) or self.imports.resolve(call.func) != "torch.save":
            return False
        if not call.args or call.args[0] is not parent:
            return False
        statement = s.statement_of(call)
        if not (isinstance(statement, cst.SimpleStatementLine) and len(statement.body) == 1):
            return False
        path = next((a.value for a in call.args[1:2] if a.keyword is None), None)
        path = path or next((a.value for a in call.args if a.keyword and a.keyword.value == "f"), None)
        new_path = statements.renamed_optimizer_path(path, site.receiver) if path is not None else None
        if new_path is None:
            return False
        first = self._sibling_saves.setdefault(reference, site.receiver)
        if first != site.receiver:
            self.info("AMP206", f"{reference}.state_dict() is saved once, next to {first}'s file (one scaler steps both)",
                      site.call)
            return True
        self.edits.insert_after(statement, f"{self.torch}.save({reference}.state_dict(), {statements.code_of(new_path)})")
        self.info("AMP206", f"{reference}.state_dict() saved too, to {statements.code_of(new_path)}", site.call)
        return True

    def _saves_state_here(self, optimizer: Optional[str]) -> bool:
        """Does this file save the optimizer's state itself (in any form)?"""
        return any(site.receiver == optimizer for site in self.structure.optimizer_state_saves)

    def _is_sibling_file_load(self, argument, optimizer: Optional[str]) -> bool:
        """`torch.load(<a path named after an optimizer>)`."""
        return (isinstance(argument, cst.Call) and self.imports.resolve(argument.func) == "torch.load"
                and bool(argument.args)
                and statements.renamed_optimizer_path(argument.args[0].value, optimizer) is not None)

    def _load_from_sibling_file(self, statement: cst.CSTNode, argument, reference: str,
                                optimizer: Optional[str]) -> bool:
        """`optimizer.load_state_dict(torch.load(".../optimizer.pt"))`: load the scaler's file too,
        when it exists (checkpoints written before the conversion have none)."""
        if not (isinstance(argument, cst.Call) and self.imports.resolve(argument.func) == "torch.load"):
            return False
        if not argument.args:
            return False
        new_path = statements.renamed_optimizer_path(argument.args[0].value, optimizer)
        if new_path is None:
            return False
        new_load = argument.with_changes(args=[argument.args[0].with_changes(value=new_path)] + list(argument.args[1:]))
        self.edits.insert_after(
            statement,
            f"try:\n    {reference}.load_state_dict({statements.code_of(new_load)})\nexcept FileNotFoundError:\n    pass",
        )
        return True
