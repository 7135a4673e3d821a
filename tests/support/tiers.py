"""The contributor's quick tier: ``pytest -m quick`` selects every test that runs in the test's own process
and starts no run, in about two minutes on 2 cores. A test leaves the tier when it, or a helper or fixture
it reaches (in its module, or imported from another of tests/), starts a run or a process: read from the
source, so that a new test is placed by what it does, with no marker to remember."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path
from typing import Dict, FrozenSet, Set, Tuple

import pytest

TESTS = Path(__file__).resolve().parents[1]
# What starts a whole run (train.py's entry, in this process or another) or any other process.
RUNS = frozenset({"run_app", "run_process", "shared_run", "shared_folder", "finished_run", "Popen", "subprocess"})
# Markers of tests that are never quick.
NOT_QUICK = ("process", "slow", "bench", "gpu", "xla", "gpu_rehearsal")

Place = Tuple[Path, str]  # a module of tests/, and a function or class of it


@functools.lru_cache(maxsize=None)
def _module(path: Path) -> Tuple[Dict[str, FrozenSet[str]], Dict[str, Place]]:
    """Each module-level function or class of ``path`` -> the names its body uses; and each name it imports
    from another module of tests/ -> where that name is defined."""
    tree = ast.parse(path.read_text())
    used: Dict[str, FrozenSet[str]] = {}
    imported: Dict[str, Place] = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {a.arg for n in ast.walk(node) if isinstance(n, ast.FunctionDef) for a in n.args.args}
            used[node.name] = frozenset(names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tests."):
            source = TESTS.joinpath(*node.module.split(".")[1:]).with_suffix(".py")  # type: ignore[union-attr]
            if source.is_file():
                imported.update({alias.asname or alias.name: (source, alias.name) for alias in node.names})
    return used, imported


def runs(place: Place, seen: Set[Place]) -> bool:
    """Whether ``place`` reaches something in :data:`RUNS`, through its module's functions and fixtures and
    the helpers it imports from tests/."""
    seen.add(place)
    path, name = place
    used_by, imported = _module(path)
    used = used_by.get(name, frozenset())
    if used & RUNS:
        return True
    reached = [(path, other) for other in used & set(used_by)] + [imported[other] for other in used & set(imported)]
    return any(runs(other, seen) for other in reached if other not in seen)


def trains(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return True
    path = Path(inspect.getfile(function))
    owner = item.cls.__name__ if getattr(item, "cls", None) else function.__name__
    fixtures = set(getattr(item, "fixturenames", ()))
    if fixtures & RUNS:
        return True
    conftest = TESTS / "conftest.py"
    return runs((path, owner), set()) or any(runs((conftest, name), set()) for name in fixtures
                                             if name in _module(conftest)[0])


def mark_quick(items: list) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in NOT_QUICK) and not trains(item):
            item.add_marker(pytest.mark.quick)
