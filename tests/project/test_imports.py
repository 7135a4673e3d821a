"""How the modules of nli/ and the Vertex launcher import each other: one way, with no circle, lazy
imports (inside functions) included; and the recipe, a plain function, imports nothing from Hydra.

The graph is read from the source (every ``import`` statement anywhere in a module), not from what
happens to be imported at run time. ``from package import name`` is an edge to the package (its
``__init__`` runs first) and, where ``name`` is a module of it, to that module too: so a package's
``__init__`` that imports a module of its own which imports the package back is a circle.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set, Tuple

from tests.support import code_map

ROOT = Path(__file__).resolve().parents[2]
TREES = {"nli": ROOT / "nli", "hydra_plugins.vertex_launcher": ROOT / "launch" / "hydra_plugins" / "vertex_launcher"}


def modules() -> Dict[str, Path]:
    """Every module of the project by its dotted name (a package by its own name, for its __init__)."""
    found = {}
    for package, folder in TREES.items():
        for path in folder.rglob("*.py"):
            parts = [*package.split("."), *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def imported(name: str, path: Path, known: Set[str]) -> Iterator[str]:
    """The project's modules that ``name`` imports anywhere in its source."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if base in known:
                yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if f"{base}.{alias.name}" in known)


def _absolute(node: ast.ImportFrom, package: str) -> str:
    if not node.level:
        return node.module or ""
    parts = package.split(".")
    base = ".".join(parts[:len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def graph() -> Dict[str, Set[str]]:
    found = modules()
    return {name: set(imported(name, path, set(found))) - {name} for name, path in found.items()}


def find_circle(edges: Dict[str, Set[str]]) -> Optional[List[str]]:
    """One circle of imports, as the modules along it (the first again at the end), or None."""
    done: Set[str] = set()

    def visit(name: str, path: List[str]) -> Optional[List[str]]:
        if name in path:
            return path[path.index(name):] + [name]
        if name in done:
            return None
        for target in sorted(edges.get(name, ())):
            circle = visit(target, [*path, name])
            if circle:
                return circle
        done.add(name)
        return None

    for start in sorted(edges):
        circle = visit(start, [])
        if circle:
            return circle
    return None


def test_no_module_imports_itself_back_through_others() -> None:
    edges = graph()
    assert "nli.recipe" in edges and "hydra_plugins.vertex_launcher._core" in edges  # the trees were read
    circle = find_circle(edges)
    assert circle is None, "import circle: " + " -> ".join(circle or [])


def test_the_circle_finder_finds_a_circle_through_a_package_and_a_lazy_import(tmp_path: Path) -> None:
    """The check above cannot pass by reading nothing: the shapes it must catch are caught."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text("from pkg import a\n")
    (package / "a.py").write_text("def f():\n    from pkg import b\n")
    (package / "b.py").write_text("from . import c\n")
    (package / "c.py").write_text("import os\n")
    known = {"pkg", "pkg.a", "pkg.b", "pkg.c"}
    paths = {"pkg": package / "__init__.py", "pkg.a": package / "a.py", "pkg.b": package / "b.py",
             "pkg.c": package / "c.py"}
    edges = {name: set(imported(name, paths[name], known)) - {name} for name in known}
    assert edges == {"pkg": {"pkg.a"}, "pkg.a": {"pkg", "pkg.b"}, "pkg.b": {"pkg", "pkg.c"}, "pkg.c": set()}
    assert find_circle(edges) == ["pkg", "pkg.a", "pkg"]


def test_the_recipe_imports_nothing_from_hydra() -> None:
    tree = ast.parse((ROOT / "nli" / "recipe.py").read_text())
    names = [alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names]
    names += [node.module or "" for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)]
    assert names and not [name for name in names if name == "hydra" or name.startswith("hydra.")]


def test_nothing_in_the_library_imports_a_process_starter() -> None:
    """The entry points (python -m nli, the image's nli.node, the XLA launcher) sit above everything."""
    starters = {"nli.__main__", "nli.node", "nli.xla_launch"}
    edges = graph()
    importers = {name: sorted(targets & starters) for name, targets in edges.items() if targets & starters}
    assert importers == {"nli.xla_launch": ["nli.__main__"]}


LAYERS = code_map.LAYERS  # nli/'s layers, from the ground up (docs/code-map.md)
LAYER = {unit: number for number, units in enumerate(LAYERS) for unit in units}
# What the Vertex launcher uses of the framework (launch/hydra_plugins/vertex_launcher/__init__.py lists it).
LAUNCHER_SURFACE = {"nli.contract", "nli.errors", "nli.io.storage", "nli.sweep.table", "nli.sweep.cost",
                    "nli.runtime.provenance", "nli.config.schema"}


def unit(module: str) -> str:
    """The top-level package or module of nli/ that ``module`` belongs to."""
    return module.split(".")[1] if module.count(".") else "__init__"


def test_every_package_and_module_of_nli_has_a_layer() -> None:
    units = {unit(name) for name in modules() if name.startswith("nli.")}
    assert units - {"__init__"} == set(LAYER), "place it in LAYERS (and docs/code-map.md)"


def test_nli_imports_only_downward_and_within_a_package() -> None:
    upward = [f"{name} -> {target}" for name, targets in graph().items() if name.startswith("nli.")
              for target in targets if target.startswith("nli.") and unit(target) != unit(name)
              and LAYER[unit(target)] >= LAYER[unit(name)] and LAYER[unit(name)] != len(LAYERS) - 1]
    assert upward == []


def test_the_layer_check_sees_an_upward_import() -> None:
    edges = graph()
    assert "nli.model.build" in edges["nli.model.lora"]  # read: what the check above walks
    assert LAYER[unit("nli.model.lora")] < LAYER[unit("nli.train.optim")]  # lora importing optim would be refused


def test_the_launcher_uses_only_its_named_surface_of_the_framework() -> None:
    used = {target for name, targets in graph().items() if name.startswith("hydra_plugins.")
            for target in targets if target.startswith("nli")}
    assert used - {"nli", "nli.io", "nli.sweep", "nli.runtime", "nli.config"} == LAUNCHER_SURFACE
    listed = (TREES["hydra_plugins.vertex_launcher"] / "__init__.py").read_text()
    assert all(f"``{module}``" in listed for module in LAUNCHER_SURFACE)


def face_of(package: str) -> Tuple[Dict[str, List[str]], List[str]]:
    """A package's face, read from its __init__: module -> its public names, and the modules offered whole."""
    call = ast.parse((ROOT / "nli" / package / "__init__.py").read_text()).body[-1].value  # type: ignore[attr-defined]
    return ast.literal_eval(call.args[1]), ast.literal_eval(call.args[2])


def test_each_package_offers_its_names_and_they_resolve() -> None:
    for package in [name for name in LAYER if (ROOT / "nli" / name / "__init__.py").exists()]:
        names, whole = face_of(package)
        face = importlib.import_module(f"nli.{package}")
        shadowed = [n for listed in names.values() for n in listed if (ROOT / "nli" / package / f"{n}.py").exists()]
        assert shadowed == [], f"nli.{package}: a name its module hides once imported; offer that module whole"
        assert sorted(face.__all__) == sorted([*(n for listed in names.values() for n in listed), *whole])
        for module, listed in names.items():
            for name in listed:
                assert getattr(face, name) is getattr(importlib.import_module(f"nli.{package}.{module}"), name)
        assert all(getattr(face, module).__name__ == f"nli.{package}.{module}" for module in whole)


def test_packages_reach_each_other_only_through_the_names_their_faces_offer() -> None:
    """An import across packages names a module offered whole, or a name its package's face lists."""
    reached = []
    for name, path in modules().items():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.ImportFrom) or node.level or not (node.module or "").startswith("nli."):
                continue
            parts = node.module.split(".")  # type: ignore[union-attr]
            within = len(parts) < 2 or parts[1] not in LAYER or parts[1] == unit(name)
            if within or not (ROOT / "nli" / parts[1]).is_dir():
                continue
            names, whole = face_of(parts[1])
            for alias in node.names:
                module = parts[2] if len(parts) > 2 else alias.name
                offered = module in whole or (len(parts) > 2 and alias.name in names.get(module, []))
                if not offered:
                    reached.append(f"{name}: from {node.module} import {alias.name}")
    assert reached == [], "list the name in its package's face (nli/<package>/__init__.py), or keep it inside"


def test_the_code_map_indexes_every_module_by_its_own_docstring() -> None:
    page = code_map.PAGE.read_text()
    stale = "docs/code-map.md is stale: python -m tests.support.code_map writes it"
    assert page == code_map.page_with_index(page), stale
    listed = set(re.findall(r"^    (nli/\S+)", page, re.M))
    assert {p.relative_to(ROOT).as_posix() for p in (ROOT / "nli").rglob("*.py")
            if p.name != "__init__.py" and "fastpaths" not in p.parts and "platform" not in p.parts} <= listed
    # Each description is its docstring's first sentence whole: "LoRA (Hu et al. 2021) through peft: ..." was cut
    # at "et al."
    cut = {path: text for path in (ROOT / "nli").rglob("*.py")
           if (text := code_map.first_line(path)).count("(") != text.count(")") or not text.endswith((".", ":"))}
    assert cut == {}, "a module's description stops mid-sentence"
