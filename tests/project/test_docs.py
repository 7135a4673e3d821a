"""What README.md and docs/ show is true of this repository.

- Every relative link leads to a file of the repository, and a link to a heading (``page.md#heading``)
  to a heading of that page, by GitHub's rule for a heading's anchor.
- README.md links to every page of docs/, and every page links back to README.md.
- Every command line a code block shows that starts a run (``python train.py ...``, ``python -m nli ...``,
  ``torchrun ... train.py ...``, ``python -m nli.xla_launch ...``) composes as typed, in this process:
  through train.py with ``--cfg job`` appended (Hydra's own command line and composition; a sweep, ``-m``,
  as its first job, since Hydra takes no ``--cfg`` with ``--multirun``); through nli.config.command.compose, which
  checks every key against the schema (``--cfg`` alone prints a ``+key`` that no schema has, where a run
  refuses it) and every rule of the schema; and a sweep through the check it gets before any job starts
  (nli.config.command). Placeholders (``$IMAGE``, ``<run>``) take a value a reader would type, and ``...`` (the
  rest of the overrides) is left out.
- Every ``python -m MODULE`` a code block shows names a module that exists, and every page of docs/ that
  the code names (in a message, say) is there.

A doc that shows a misspelt key, a group option that is gone or a module that moved fails here.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override

from nli.config import command
from nli.config.command import compose
from nli.errors import UserError
from tests.support.runs import CONF, ROOT, run_app, slurm_commands

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# What a reader types in place of the docs' placeholders, so that the line can compose.
PLACEHOLDERS = {
    "$(git rev-parse --short HEAD)": "abc1234",
    "$TPU_IMAGE": "us-central1-docker.pkg.dev/my-project/nli/train-tpu:abc1234",
    "$IMAGE": "us-central1-docker.pkg.dev/my-project/nli/train:abc1234",
    "<run>": "2026-01-05_10-00-00",
}
# Runs a doc shows that do not work today, each with its reason, until the fault is fixed.
KNOWN_FAULTS: Dict[str, str] = {}  # a shown command's words -> why it fails today (strict: fixed, it must go)
ELIDED = "..."  # "the rest of your overrides": left out
RUNS = re.compile(r"^(?:\S*/)?(?:python3?|torchrun)(?:\s|$)")  # python, .venv-xla/bin/python, torchrun
FENCE = re.compile(r"^\s*(```|~~~)")


@dataclass(frozen=True)
class Shown:
    """A command line as a doc shows it: where, and its words once the shell has split them."""

    where: str
    words: Tuple[str, ...]


def code_lines(text: str) -> Iterator[Tuple[int, str]]:
    """The lines of ``text``'s code blocks (fenced, or indented by four spaces or more), numbered from 1."""
    fenced = False
    for number, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
        elif fenced or line.startswith("    "):
            yield number, line


def commands(path: Path) -> Iterator[Shown]:
    """Each command of ``path``'s code blocks, continuation lines joined, ``&&``-chains split."""
    lines = list(code_lines(path.read_text()))
    index = 0
    while index < len(lines):
        number, line = lines[index]
        while line.rstrip().endswith("\\") and index + 1 < len(lines):
            index += 1
            line = line.rstrip()[:-1] + " " + lines[index][1].strip()
        index += 1
        line = re.sub(r"\s#\s.*$", "", line)  # a comment after the command
        for placeholder, value in PLACEHOLDERS.items():
            line = line.replace(placeholder, value)
        for part in re.split(r"\s(?:&&|;|\|\|?)\s", line.strip()):
            if RUNS.match(part.strip()):
                where = f"{_name(path)}:{number}"
                yield Shown(where, tuple(word for word in shlex.split(part) if word != ELIDED))


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT)) if ROOT in path.parents else path.name


def run_args(words: Tuple[str, ...]) -> Optional[List[str]]:
    """The arguments ``train.py`` gets from ``words``; None where the command starts no run."""
    if "train.py" in words:
        return list(words[words.index("train.py") + 1:])
    if "-m" in words[:2] and words[words.index("-m") + 1] in ("nli", "nli.xla_launch"):
        return list(words[words.index("-m") + 2:])
    return None


def shown_runs() -> List[Any]:
    """Each run the docs show, once however many places show it, as a test case named by its first place;
    one that a known fault stops is expected to fail (strict: once the fault is fixed, the case says so, and
    its entry in KNOWN_FAULTS goes)."""
    places: Dict[Tuple[str, ...], List[str]] = {}
    for path in DOCS:
        for shown in commands(path):
            args = run_args(shown.words)
            if args is not None:
                places.setdefault(tuple(args), []).append(shown.where)
    return [pytest.param(list(args), ", ".join(where), id=where[0], marks=_known_fault(list(args)))
            for args, where in places.items()]


def _known_fault(args: List[str]) -> List[Any]:
    return [pytest.mark.xfail(strict=True, reason=reason) for typed, reason in KNOWN_FAULTS.items() if typed in args]


def shown_modules() -> List[Tuple[str, str]]:
    return [(shown.where, shown.words[shown.words.index("-m") + 1]) for path in DOCS for shown in commands(path)
            if shown.words[0].endswith(("python", "python3")) and "-m" in shown.words[:2]]


def first_job(args: List[str]) -> List[str]:
    """A sweep's overrides as its first job has them: each swept key at its first value (a search's range: its
    start), no ``-m``."""
    overrides = OverridesParser.create().parse_overrides([arg for arg in args if arg not in command.MULTIRUN])
    return [f"{str(o.input_line).split('=', 1)[0]}={first_value(o)}" if o.is_sweep_override() else str(o.input_line)
            for o in overrides]


def first_value(override: Override) -> str:
    if override.is_interval_sweep():
        return str(override.value().start)
    return str(next(iter(override.sweep_string_iterator())))


@pytest.mark.parametrize("args,where", shown_runs())
def test_every_run_shown_composes(args: List[str], where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                  ) -> None:
    if "hydra/launcher=submitit_slurm" in args:  # a command for a Slurm login node, checked as there
        monkeypatch.setenv("PATH", f"{slurm_commands(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    job = first_job(args)
    proc = run_app([*job, "--cfg", "job"], cwd=tmp_path)  # Hydra's command line and composition
    assert proc.returncode == 0, f"{where}: python train.py {' '.join(job)} --cfg job\n{proc.stderr}"
    assert "task:" in proc.stdout  # the composed config, printed
    try:
        compose(job)  # every key the schema's (--cfg lets a +key through), every rule of the schema
    except UserError as refused:
        pytest.fail(f"{where}: python train.py {' '.join(job)}\n{refused}")
    if job != args:  # a sweep: the check it gets before any job starts (its keys, its directory)
        try:
            command.check(args, CONF, "train")
        except SystemExit as refused:
            pytest.fail(f"{where}: python train.py {' '.join(args)}\n{refused}")


def test_git_ignores_every_folder_the_readme_writes_into() -> None:
    """A run the README shows leaves no untracked files for git to show: the folders its commands name
    (hydra.run.dir, hydra.sweep.dir, --out) and the run's and sweep's defaults (conf/train.yaml)."""
    folders = {"outputs/mnli/2026-01-01_00-00-00", "multirun/mnli/2026-01-01_00-00-00"}
    for shown in commands(ROOT / "README.md"):
        for word, following in zip(shown.words, (*shown.words[1:], "")):
            value = word.split("=", 1)[1] if word.startswith(("hydra.run.dir=", "hydra.sweep.dir=")) else \
                following if word == "--out" else None
            if value and not value.startswith(("gs://", "/", "$", "<")):
                folders.add(value)
    assert "runs/rte-1" in folders  # the README's own example, found
    if not (ROOT / ".git").exists():
        pytest.skip("not a git checkout: nothing for git to ignore")
    proc = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *sorted(folders)],
                          cwd=ROOT, capture_output=True, text=True)
    shown = [line.split("\t")[-1] for line in proc.stdout.splitlines() if line.startswith("::")]
    assert not shown, f"git would show these as untracked: {shown}; add them to .gitignore"
    ours = ["tests/runs/test_new.py", "nli/runs/new.py"]  # the repository's own files stay visible to git
    proc = subprocess.run(["git", "check-ignore", "--no-index", *ours], cwd=ROOT, capture_output=True, text=True)
    assert proc.stdout == "", f"git ignores new files of the repository: {proc.stdout.split()}"


@pytest.mark.parametrize("where,module", shown_modules(), ids=[where for where, _ in shown_modules()])
def test_every_module_shown_exists(where: str, module: str) -> None:
    assert importlib.util.find_spec(module) is not None, f"{where}: python -m {module}: no such module"


def test_every_page_the_code_names_exists() -> None:
    """Messages and comments that send a reader to a page of docs/ (the Vertex launcher's) name one that is there."""
    folders = ("nli", "launch", "benchmarks", "conf", "tests", ".ci")
    sources = [path for folder in folders for path in (ROOT / folder).rglob("*")
               if path.suffix in (".py", ".yaml", "") and path.is_file()]
    named = {(path, name) for path in sources
             for name in re.findall(r"\bdocs/[\w-]+\.md", path.read_text(errors="ignore"))}
    assert named, "no page of docs/ named anywhere: this test looks in the wrong places"
    missing = sorted(f"{_name(path)}: {name}" for path, name in named if not (ROOT / name).exists())
    assert not missing, "\n".join(missing)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, code marks and punctuation dropped, spaces to '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors of ``path``'s headings; a repeated heading's later ones get -1, -2, ... as on GitHub."""
    seen: Dict[str, int] = {}
    found = set()
    text = path.read_text()
    code = {number for number, _ in code_lines(text)}
    lines = (line for number, line in enumerate(text.splitlines(), 1) if number not in code)
    for heading in (match.group(1) for line in lines if (match := re.match(r"^#{1,6} (.+)$", line))):
        base = slug(heading)
        found.add(f"{base}-{seen[base]}" if base in seen else base)
        seen[base] = seen.get(base, 0) + 1
    return found


def _prose(text: str) -> Iterator[Tuple[int, str]]:
    """``text``'s lines outside code blocks, inline code spans blanked."""
    code = {number for number, _ in code_lines(text)}
    for number, line in enumerate(text.splitlines(), 1):
        if number not in code and not FENCE.match(line):
            yield number, re.sub(r"`[^`]*`", "``", line)


def links(path: Path) -> Iterator[Tuple[int, str]]:
    """The targets of ``path``'s Markdown links and images, outside code."""
    for number, line in _prose(path.read_text()):
        for target in re.findall(r"\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", line):
            yield number, target


def broken(path: Path, target: str) -> Optional[str]:
    """Why the link ``target`` of ``path`` leads nowhere; None where it leads to a file (and heading)."""
    if re.match(r"^[a-z]+:", target):
        return None  # https:, mailto: and the like: not this repository's
    name, _, anchor = target.partition("#")
    file = (path.parent / name).resolve() if name else path
    if not file.exists():
        return "no such file"
    if name and ROOT not in file.parents:
        return "outside the repository"
    if anchor and file.suffix == ".md" and anchor not in anchors(file):
        return f"no heading #{anchor} in {_name(file)}"
    return None


@pytest.mark.parametrize("path", DOCS, ids=[str(path.relative_to(ROOT)) for path in DOCS])
def test_every_link_resolves(path: Path) -> None:
    problems = [f"{_name(path)}:{number}: ({target}): {why}" for number, target in links(path)
                if (why := broken(path, target))]
    assert not problems, "\n".join(problems)


def test_readme_and_docs_link_both_ways() -> None:
    readme = {target.partition("#")[0] for _, target in links(ROOT / "README.md")}
    pages = [path for path in DOCS if path.parent.name == "docs"]
    assert pages and all(f"docs/{page.name}" in readme for page in pages), \
        f"README.md links no page {[page.name for page in pages if f'docs/{page.name}' not in readme]}"
    for page in pages:
        assert any(target.partition("#")[0] == "../README.md" for _, target in links(page)), \
            f"{page.relative_to(ROOT)} links no way back to README.md"


def test_the_checks_find_what_they_look_for(tmp_path: Path) -> None:
    """The parsing above finds what a doc shows: a continued line joined, a sweep, a comment, a chain."""
    doc = tmp_path / "doc.md"
    doc.write_text("Run:\n\n    pip install . && python train.py task=rte \\\n        optimizer.lr=1e-5  # here\n\n"
                   "```\npython -m nli -m seed=1,2 ...\n# Not a heading\n```\n\n"
                   "[a](#run-evalextra) [b](missing.md) [c](https://x.org) `[d](#not-a-heading)`\n\n"
                   "## Run: `eval.extra`\n")
    shown = list(commands(doc))
    assert [run_args(each.words) for each in shown] == [["task=rte", "optimizer.lr=1e-5"], ["-m", "seed=1,2"]]
    assert first_job(["-m", "seed=1,2", "model=tiny"]) == ["seed=1", "model=tiny"]
    assert [(target, broken(doc, target)) for _, target in links(doc)] == [
        ("#run-evalextra", None), ("missing.md", "no such file"), ("https://x.org", None)]
    assert anchors(doc) == {"run-evalextra"}
    assert slug("Evaluating on HANS, ANLI and SNLI") == "evaluating-on-hans-anli-and-snli"
    assert slug("`eval.extra`: more sets") == "evalextra-more-sets"
