"""Project modules a check reads beside the file it converts (the model code a training file imports),
parsed once per process: the same modules serve every file of a run."""

from __future__ import annotations

from typing import Dict, Optional, Tuple

import libcst as cst

from ampify.transforms.kit.imports import ImportMap
from ampify.transforms.kit.positions import Positions

#: parsed modules by source; cleared past this many (a run over a monorepo must not hold them all)
_PARSED: Dict[bytes, Optional[Tuple[cst.Module, ImportMap, Positions]]] = {}
_MAX_KEPT = 64


def parsed_module(source: bytes) -> Optional[Tuple[cst.Module, ImportMap, Positions]]:
    """(module, imports, positions) of a project module's source; None when it does not parse."""
    if source not in _PARSED:
        if len(_PARSED) > _MAX_KEPT:
            _PARSED.clear()
        try:
            module = cst.parse_module(source)
        except Exception:  # noqa: BLE001 - a module that does not parse is not followed
            _PARSED[source] = None
        else:
            _PARSED[source] = (module, ImportMap.from_module(module), Positions(module))
    return _PARSED[source]
