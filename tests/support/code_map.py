"""docs/code-map.md's index of nli/, made from the package tree: each layer from the top down, each
package with its docstring's first paragraph, each module with its docstring's first line.
tests/project/test_imports.py checks the page against it; ``python -m tests.support.code_map`` writes it again."""

from __future__ import annotations

import ast
import re
import textwrap
from pathlib import Path
from typing import List

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "code-map.md"
BEGIN = "<!-- made by python -m tests.support.code_map: edit the docstrings, not this -->"
END = "<!-- end of the index -->"
# nli/'s layers, from the ground up: a module imports only from its own package and the layers below.
# The top is the recipe and the commands.
LAYERS = [("errors", "contract", "_face"), ("io",), ("config",), ("runtime",), ("data",), ("model",), ("evaluate",),
          ("tracking",), ("train",), ("output",), ("sweep",),
          ("recipe", "cli", "__main__", "report", "cloud", "node", "xla_launch", "optim")]
WIDTH, NAME_WIDTH = 116, 40  # a module's description starts after its path, two spaces at least


def docstring(path: Path) -> str:
    return ast.get_docstring(ast.parse(path.read_text())) or ""


def first_line(path: Path) -> str:
    """A module's docstring up to its first full stop or blank line, on one line: a stop ends a sentence where
    the next begins with a capital or code, not inside "(Hu et al. 2021)"."""
    text = " ".join(docstring(path).split("\n\n")[0].split())
    end = re.search(r"\. (?=[A-Z`])", text)
    return text if end is None else text[:end.start() + 1]


def entry(name: str, text: str) -> List[str]:
    lines = textwrap.wrap(text, WIDTH - NAME_WIDTH) or [""]
    assert len(name) <= NAME_WIDTH - 6, f"{name}: a path longer than the code map's column"
    return [f"    {name:<{NAME_WIDTH - 4}}{lines[0]}".rstrip(), *(f"{'':<{NAME_WIDTH}}{line}" for line in lines[1:])]


def package_section(name: str) -> List[str]:
    folder = ROOT / "nli" / name
    about = " ".join(docstring(folder / "__init__.py").split("\n\n")[0].split())
    lines = [f"### `nli/{name}/`", "", *textwrap.wrap(about, WIDTH), ""]
    for path in sorted(folder.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if path.name == "__init__.py" and path.parent == folder:
            continue
        shown = relative[:-len("/__init__.py")] + "/" if path.name == "__init__.py" else relative
        lines += entry(shown, first_line(path))
    return [*lines, ""]


def modules_section(names: List[str], title: str) -> List[str]:
    lines = [f"### {title}", ""]
    for name in names:
        lines += entry(f"nli/{name}.py", first_line(ROOT / "nli" / f"{name}.py"))
    return [*lines, ""]


def index() -> str:
    lines = [BEGIN, ""]
    for number, units in reversed(list(enumerate(LAYERS))):
        if number == len(LAYERS) - 1:
            lines += modules_section(list(units), "The top: the recipe and the commands")
        elif number == 0:
            lines += modules_section(list(units), "The ground: what every layer may use")
        else:
            lines += package_section(units[0])
    return "\n".join([*lines, END])


def page_with_index(page: str) -> str:
    head, _, rest = page.partition(BEGIN)
    _, _, tail = rest.partition(END)
    return head + index() + tail


if __name__ == "__main__":
    PAGE.write_text(page_with_index(PAGE.read_text()))
