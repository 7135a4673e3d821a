"""tests/ is laid out as the code (docs/testing.md): each folder of tests/nli/ is a package of nli/, and a
test file there named after a module of nli/ sits where that module does."""

from __future__ import annotations

from pathlib import Path
from typing import Dict, Set

ROOT = Path(__file__).resolve().parents[2]
NLI, TESTS_NLI = ROOT / "nli", ROOT / "tests" / "nli"


def test_each_folder_of_tests_nli_is_a_package_of_nli() -> None:
    folders = [p.relative_to(TESTS_NLI) for p in TESTS_NLI.rglob("*") if p.is_dir() and p.name != "__pycache__"]
    stale = [str(f) for f in folders if not (NLI / f / "__init__.py").is_file()]
    assert folders and not stale, f"tests/nli/ folders with no package of nli/ behind them: {stale}"


def test_a_test_named_after_a_module_sits_in_that_modules_folder() -> None:
    places: Dict[str, Set[Path]] = {}
    for module in NLI.rglob("*.py"):
        places.setdefault(module.stem, set()).add(module.parent.relative_to(NLI))
    for package in (p for p in NLI.rglob("__init__.py") if p.parent != NLI):
        places.setdefault(package.parent.name, set()).add(package.parent.parent.relative_to(NLI))
    misplaced = []
    for test in TESTS_NLI.rglob("test_*.py"):
        where = places.get(test.stem.removeprefix("test_"))
        if where and test.parent.relative_to(TESTS_NLI) not in where:
            misplaced.append(f"{test.relative_to(ROOT)} (its module is in nli/{'/'.join(map(str, where))})")
    assert not misplaced, f"test files away from their modules: {misplaced}"
