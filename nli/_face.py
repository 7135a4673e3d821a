"""A package's face: the names it offers the packages above it, each read from its module when first
asked for. Importing a package thus costs nothing until a name is used (``python train.py --help``
answers before torch loads), and a class path a config records (``nli.sweep.SweepResults``) resolves.

Packages import each other's modules by their full names (``from nli.runtime.device import Compute``),
so that type checkers and editors follow them; tests/project/test_imports.py holds every such import to the names
a face lists."""

from __future__ import annotations

import importlib
from typing import Any, Callable, Dict, List, Mapping, Sequence, Tuple


def face(package: str, names: Mapping[str, Sequence[str]], modules: Sequence[str] = ()
         ) -> Tuple[List[str], Callable[[str], Any], Callable[[], List[str]]]:
    """``__all__``, ``__getattr__`` and ``__dir__`` for ``package``: ``names`` maps each of its modules to
    the names it offers; ``modules`` are offered whole (``from nli.runtime import xla``: every name of
    theirs without a leading underscore). No name may be a module's: Python sets a package's attribute to
    its module once the module is imported, hiding the name. A name is looked up afresh on each use, so that a test's
    monkeypatch of the module is seen."""
    home: Dict[str, str] = {name: module for module, listed in names.items() for name in listed}

    def __getattr__(name: str) -> Any:
        if name in modules:
            return importlib.import_module(f"{package}.{name}")
        if name not in home:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{package}.{home[name]}"), name)

    def __dir__() -> List[str]:
        return sorted([*home, *modules])

    return sorted([*home, *modules]), __getattr__, __dir__
