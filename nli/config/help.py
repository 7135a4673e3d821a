"""``--help`` for ``train.py`` and ``python -m nli``: every key of the config with its description,
in about a second, without torch.

Hydra's own ``--help`` asks its config loader for the options of every config group, its own and
the app's, and each question deep-copies the whole config repository, ConfigStore included: about
3 s for this project, every time someone asks. The app's groups are the folders of ``conf/``, so
they are read from there; the config is composed once, with Hydra's compose API and the same
overrides; the text follows the composed ``hydra.help`` template, so a customised template still
applies. Whatever needs Hydra's full machinery (its own groups, its flags, other flags such as
``--resolve``) is left to Hydra. An override that does not compose is Hydra's message, without the
traceback Hydra's own help ends in.

Where Hydra prints the config as plain YAML, this help writes each key's description after it as a
YAML comment, as Hugging Face's ``run_glue.py --help`` lists each argument's. The descriptions are
the schema's own comments (nli/config/schema.py), read from its source: a field's trailing comment, or,
where it has none, the comment lines directly above it. Which schema describes a node is the type
OmegaConf gave it while composing (``OmegaConf.get_type``), so the help follows whatever the
composed config holds: a group option's own subclass, a dict of named logger configs, a sub-block.
"""

from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import io
import os
import re
import shutil
import string
import sys
import textwrap
import tokenize
from pathlib import Path
from typing import Any, Dict, List, Optional, Set, Tuple, cast

import yaml
from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict
from omegaconf._utils import get_omega_conf_dumper

HELP_FLAGS = ("--help", "-h")
HYDRA_ONLY = ("$HYDRA_CONFIG_GROUPS", "$FLAGS_HELP", "${HYDRA_CONFIG_GROUPS}", "${FLAGS_HELP}")

# Comments that talk to tools rather than to people.
PRAGMA = re.compile(r"(noqa|type:|pragma|pylint:|fmt:|mypy:|isort:)", re.IGNORECASE)
ALIGN_UP_TO = 44  # descriptions line up at one column after the keys, unless a line is longer than this
MIN_DESCRIPTION_WIDTH = 30  # a description wraps to the terminal's width, but never narrower than this

Line = Tuple[str, Optional[str]]  # a line of YAML, and the description that goes after it


# ------------------------------------------------------------------------------- descriptions


@dataclasses.dataclass
class _Source:
    """One Python file: its syntax tree and its comments."""

    tree: ast.Module
    comments: Dict[int, str]  # line -> the comment's text
    alone: Set[int]  # lines that hold nothing but a comment


@functools.lru_cache(maxsize=None)
def _source(filename: str) -> _Source:
    with tokenize.open(filename) as file:
        text = file.read()
    comments, alone = {}, set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type == tokenize.COMMENT:
            row, col = token.start
            comments[row] = token.string.lstrip("#").strip()
            if not token.line[:col].strip():
                alone.add(row)
    return _Source(ast.parse(text, filename), comments, alone)


def _class_node(tree: ast.Module, qualname: str) -> Optional[ast.ClassDef]:
    """The class statement of ``qualname`` (the last one, as the module ends up with it)."""
    body: List[ast.stmt] = tree.body
    found = None
    for name in qualname.split("."):
        found = None
        for stmt in body:
            if isinstance(stmt, ast.ClassDef) and stmt.name == name:
                found = stmt
        if found is None:
            return None  # e.g. a class defined inside a function
        body = found.body
    return found


def _comment(rows: List[int], source: _Source) -> Optional[str]:
    texts = [source.comments[row] for row in rows if row in source.comments]
    texts = [text for text in texts if text and not PRAGMA.match(text)]
    return " ".join(texts) or None


@functools.lru_cache(maxsize=None)
def _declared(cls: type) -> Dict[str, str]:
    """The descriptions of the fields ``cls`` itself declares: each field's trailing comment, else
    the comment lines directly above it. Fields with neither are left out."""
    try:
        source = _source(inspect.getsourcefile(cls) or "")
    except (OSError, TypeError, SyntaxError, UnicodeDecodeError):
        return {}
    node = _class_node(source.tree, cls.__qualname__)
    if node is None:
        return {}
    described = {}
    for stmt in node.body:
        if not (isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)):
            continue
        trailing = _comment(list(range(stmt.lineno, (stmt.end_lineno or stmt.lineno) + 1)), source)
        above: List[int] = []
        row = stmt.lineno - 1
        while row in source.alone:
            above.insert(0, row)
            row -= 1
        text = trailing or _comment(above, source)
        if text:
            described[stmt.target.id] = text
    return described


def field_descriptions(cls: Any) -> Dict[str, str]:
    """Field name -> description for the dataclass ``cls``, its inherited fields included (a field
    a subclass declares again keeps its base's description unless it brings its own)."""
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        return {}
    described: Dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            described.update(_declared(klass))
    fields = {f.name for f in dataclasses.fields(cls)}
    return {name: text for name, text in described.items() if name in fields}


# --------------------------------------------------------------------------- the config, in YAML


def _dump(data: Any) -> List[str]:
    """``data`` in YAML as OmegaConf.to_yaml writes it (long strings are not folded)."""
    text = yaml.dump(data, Dumper=get_omega_conf_dumper(), default_flow_style=False, allow_unicode=True,
                     sort_keys=False, width=float("inf"))
    return text.splitlines()


def _child(node: Any, key: Any) -> Any:
    try:
        return node._get_node(key) if isinstance(node, (DictConfig, ListConfig)) else None
    except Exception:  # a key the container does not take as it came out of to_container: no types below
        return None


def _nested(node: Any, value: Any, indent: int) -> Optional[List[Line]]:
    """The lines under a key whose value is a non-empty mapping or sequence; None for a scalar."""
    if isinstance(value, dict) and value:
        return _mapping(node, value, indent + 2)
    if isinstance(value, list) and value:
        return _sequence(node, value, indent)  # PyYAML does not indent a sequence under its key
    return None


def _mapping(node: Any, value: Dict[Any, Any], indent: int) -> List[Line]:
    described = field_descriptions(OmegaConf.get_type(node)) if isinstance(node, DictConfig) else {}
    pad, lines = " " * indent, []
    for key, item in value.items():
        child = _child(node, key)
        below = _nested(child, item, indent)
        if below is None:  # a scalar, {} or []: its own line(s); the description after the last
            dumped = [pad + text for text in _dump({key: item})]
            lines += [(text, None) for text in dumped[:-1]] + [(dumped[-1], described.get(key))]
        else:
            head = _dump({key: None})[0][: -len(" null")]  # the key as YAML writes it, and its colon
            lines += [(pad + head, described.get(key)), *below]
    return lines


def _sequence(node: Any, value: List[Any], indent: int) -> List[Line]:
    pad = " " * indent
    lines: List[Line] = []
    for index, item in enumerate(value):
        child = _child(node, index)
        if isinstance(item, dict) and item:
            inner = _mapping(child, item, indent + 2)
        elif isinstance(item, list) and item:
            inner = _sequence(child, item, indent + 2)
        else:
            lines += [(pad + text, None) for text in _dump([item])]
            continue
        text, description = inner[0]  # the item's first line goes after its dash
        lines += [(pad + "- " + text[indent + 2:], description), *inner[1:]]
    return lines


def described_yaml(cfg: DictConfig, width: Optional[int] = None) -> str:
    """``OmegaConf.to_yaml(cfg)`` with each key's description as a comment after it, aligned."""
    lines = _mapping(cfg, cast(Dict[Any, Any], OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)), 0)
    width = width or shutil.get_terminal_size((120, 24)).columns
    column = max((len(text) for text, description in lines if description and len(text) <= ALIGN_UP_TO),
                 default=0) + 2
    out = []
    for text, description in lines:
        if not description:
            out.append(text)
            continue
        start = max(column, len(text) + 2)
        wrapped = textwrap.wrap(description, max(width - start - 2, MIN_DESCRIPTION_WIDTH)) or [description]
        out.append(f"{text.ljust(start)}# {wrapped[0]}")
        out += [f"{' ' * start}# {rest}" for rest in wrapped[1:]]
    return "".join(line + "\n" for line in out)


# ------------------------------------------------------------------------------------ the help


def config_groups(conf_dir: Path) -> Dict[str, List[str]]:
    """Every folder of ``conf_dir`` that holds configs, with its options (the file names), but Hydra's own
    groups (``hydra/launcher``'s presets), which Hydra lists under ``--hydra-help``, as it does."""
    groups = {}
    for folder in sorted(path for path in conf_dir.rglob("*") if path.is_dir() and path.parts[len(conf_dir.parts)]
                         != "hydra"):
        options = sorted(path.stem for path in folder.glob("*.yaml"))
        if options:
            groups[folder.relative_to(conf_dir).as_posix()] = options
    return groups


def help_text(conf_dir: Path, config_name: str, overrides: List[str]) -> Optional[str]:
    """The app's help, as Hydra would print it but with each key's description, or None where
    only Hydra can write it."""
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    except HydraException as err:
        raise SystemExit(f"error: {err}") from None  # Hydra's own --help would end in a traceback
    template = cfg.hydra.help.template
    if any(name in template for name in HYDRA_ONLY):
        return None
    with open_dict(cfg):
        del cfg["hydra"]  # as Hydra shows it: the job's config alone
    groups = "".join(f"{group}: {', '.join(options)}\n" for group, options in config_groups(conf_dir).items())
    return string.Template(template).substitute(APP_CONFIG_GROUPS=groups, CONFIG=described_yaml(cfg))


def answer_help(argv: List[str], conf_dir: Path, config_name: str) -> bool:
    """Print the help if ``argv`` asks for it and this module can write it; True if it did."""
    if not any(arg in HELP_FLAGS for arg in argv):
        return False
    rest = [arg for arg in argv if arg not in HELP_FLAGS]
    if any(arg.startswith("-") for arg in rest):
        return False
    text = help_text(conf_dir, config_name, rest)
    if text is None:
        return False
    try:
        print(text, flush=True)
    except BrokenPipeError:  # `--help | head`: the reader has seen enough
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit
    return True
