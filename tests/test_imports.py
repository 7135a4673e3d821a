"""How the modules of nli/ and the Vertex launcher import each other: one way, with no circle, lazy
imports (inside functions) included; and the recipe, a plain function, imports nothing from Hydra.

The graph is read from the source (every ``import`` statement anywhere in a module), not from what
happens to be imported at run time. ``from package import name`` is an edge to the package (its
``__init__`` runs first) and, where ``name`` is a module of it, to that module too: so a package's
``__init__`` that imports a module of its own which imports the package back is a circle.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Set

ROOT = Path(__file__).resolve().parents[1]
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
