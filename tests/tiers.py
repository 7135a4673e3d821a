"""The contributor's quick tier: ``pytest -m quick`` selects every test that runs in the test's own process
and trains at most a few steps of a model built in it, in about two minutes on 2 cores. A test leaves the
tier when it, or a helper or fixture it reaches, starts a run or a process: read from the test module's
source, so that a new test is placed by what it does, with no marker to remember."""

from __future__ import annotations

import ast
import functools
import inspect
from pathlib import Path
from typing import Dict, FrozenSet, Set

import pytest

# What starts a whole run (train.py's entry, in this process or another) or any other process.
RUNS = frozenset({"run_app", "run_process", "shared_run", "shared_folder", "finished_run", "run_sweep", "Popen",
                  "subprocess", "preempted", "uninterrupted"})


@functools.lru_cache(maxsize=None)
def _names_used(path: Path) -> Dict[str, FrozenSet[str]]:
    """Each module-level function (test, helper or fixture) of ``path`` -> the names its body uses."""
    used: Dict[str, FrozenSet[str]] = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            names |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)}
            names |= {a.arg for n in ast.walk(node) if isinstance(n, ast.FunctionDef) for a in n.args.args}
            used[node.name] = frozenset(names)
    return used


def _runs(path: Path, name: str, seen: Set[str]) -> bool:
    """Whether function ``name`` of ``path`` reaches something in :data:`RUNS`, through the module's own
    functions and the fixtures it names."""
    used = _names_used(path).get(name, frozenset())
    if used & RUNS:
        return True
    seen.add(name)
    return any(_runs(path, other, seen) for other in used & set(_names_used(path)) - seen)


def trains(item: pytest.Item) -> bool:
    function = getattr(item, "function", None)
    if function is None:
        return True
    path = Path(inspect.getfile(function))
    owner = item.cls.__name__ if getattr(item, "cls", None) else function.__name__
    fixtures = set(getattr(item, "fixturenames", ())) & RUNS
    return bool(fixtures) or _runs(path, owner, set())


def mark_quick(items: list) -> None:
    for item in items:
        if not any(item.get_closest_marker(name) for name in ("process", "slow", "bench", "gpu", "xla",
                                                                   "gpu_rehearsal")) and not trains(item):
            item.add_marker(pytest.mark.quick)
