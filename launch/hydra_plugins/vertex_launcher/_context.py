"""The Docker build context of the project: the files ``docker build .`` would send, read with
``.dockerignore`` as Docker reads it, their digest (which names the image built from them), and the
tarball Cloud Build takes as its source.

Docker's matcher (moby's ``patternmatcher``) is small and its rules are few, so it is written out
here rather than taken from docker-py, which the launcher does not otherwise need: a line is a
pattern (``#`` starts a comment), ``!`` makes it an exception, ``*`` and ``?`` stay within a path
segment, ``**`` spans any number of them, and a pattern that matches a folder leaves out everything
in it. The last pattern that matches a path (or one of its parent folders) decides.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterator, List, Mapping, Pattern, Tuple

DOCKERIGNORE = ".dockerignore"
DOCKERFILE = "Dockerfile"
# Sent whatever .dockerignore says (the Docker client adds them back): the build needs them, though
# no COPY can take them into the image.
ALWAYS_SENT = (DOCKERFILE, DOCKERIGNORE)
TAG_PREFIX = "src-"  # the image tag: src-<the context's digest>
TAG_HEX = 32  # 128 bits of the SHA-256: no two contents of one project meet


@dataclass(frozen=True)
class IgnorePattern:
    regex: Pattern[str]
    exclusion: bool  # a `!` line: takes back what an earlier line left out


def read_dockerignore(text: str) -> List[IgnorePattern]:
    patterns = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        exclusion = line.startswith("!")
        line = line[1:].strip() if exclusion else line
        cleaned = os.path.normpath(line).lstrip("/") if line not in ("/", ".") else ""
        if cleaned in ("", "."):
            continue  # Docker ignores a pattern of the context itself
        patterns.append(IgnorePattern(re.compile(_regex(cleaned)), exclusion))
    return patterns


def _regex(pattern: str) -> str:
    """moby's translation of one cleaned pattern (patternmatcher.Pattern.compile) into a regex."""
    out, i, in_class = "^", 0, False
    while i < len(pattern):
        char = pattern[i]
        if in_class:  # a [...] class, as Go's filepath.Match reads it: its characters as they are
            in_class = char != "]"
            out += "\\\\" if char == "\\" else char
        elif pattern.startswith("**", i):
            i += 2
            if pattern[i:i + 1] == "/":
                i += 1  # `**/` is `**`
            out += ".*" if i >= len(pattern) else "(.*/)?"
            continue
        elif char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            in_class = True
            out += char
        elif char == "\\" and i + 1 < len(pattern):
            i += 1
            out += re.escape(pattern[i])
        else:
            out += re.escape(char)
        i += 1
    return out + "$"


def ignored(path: str, patterns: List[IgnorePattern]) -> bool:
    """Whether ``path`` (relative, with `/`) stays out of the context (moby's MatchesOrParentMatches)."""
    parts = path.split("/")
    candidates = ["/".join(parts[:n]) for n in range(1, len(parts) + 1)]  # its folders, then itself
    matched = False
    for pattern in patterns:
        if pattern.exclusion != matched:
            continue  # only an exception can change a match, and only a pattern can make one
        if any(pattern.regex.match(candidate) for candidate in candidates):
            matched = not pattern.exclusion
    return matched


def context_files(root: Path) -> List[str]:
    """The files of the build context, relative to ``root`` and sorted; links are kept as links."""
    ignore_file = root / DOCKERIGNORE
    patterns = read_dockerignore(ignore_file.read_text()) if ignore_file.is_file() else []
    found = [path for path in _walk(root, "", patterns)]
    found += [name for name in ALWAYS_SENT if (root / name).is_file() and name not in found]
    return sorted(found)


def _walk(root: Path, prefix: str, patterns: List[IgnorePattern]) -> Iterator[str]:
    """Descends only into folders something could come out of: an ignored folder with no exception
    below it (outputs/, .git) is never listed, however large."""
    with os.scandir(root / prefix if prefix else root) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            relative = f"{prefix}{entry.name}"
            if entry.is_dir(follow_symlinks=False):
                if not ignored(relative, patterns) or any(p.exclusion for p in patterns):
                    yield from _walk(root, relative + "/", patterns)
            elif not ignored(relative, patterns):
                yield relative


def digest(root: Path, files: List[str], settings: Mapping[str, str]) -> str:
    """SHA-256 of what makes the image: each file's path, executable bit and bytes (or a link's target),
    and the build's settings (the Dockerfile's target and build arguments)."""
    sha = hashlib.sha256()
    for name, value in sorted(settings.items()):
        sha.update(f"setting\0{name}\0{value}\0".encode())
    for relative in files:
        path = root / relative
        if path.is_symlink():
            sha.update(f"link\0{relative}\0{os.readlink(path)}\0".encode())
            continue
        executable = "x" if os.access(path, os.X_OK) else "-"
        sha.update(f"file\0{relative}\0{executable}\0{path.stat().st_size}\0".encode())
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                sha.update(block)
    return sha.hexdigest()


def image_tag(root: Path, settings: Mapping[str, str]) -> Tuple[str, List[str]]:
    """The tag that names the image of this content, and the context's files."""
    files = context_files(root)
    return TAG_PREFIX + digest(root, files, settings)[:TAG_HEX], files


def tarball(root: Path, files: List[str]) -> bytes:
    """The context as a .tar.gz, as `gcloud builds submit` uploads it; owners and times are left out,
    so the same content makes the same bytes."""
    buffer = io.BytesIO()
    with gzip.GzipFile(fileobj=buffer, mode="wb", mtime=0) as zipped, \
            tarfile.open(fileobj=zipped, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for relative in files:
            info = tar.gettarinfo(str(root / relative), arcname=relative)
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(root / relative, "rb") as stream:
                    tar.addfile(info, stream)
            else:
                tar.addfile(info)
    return buffer.getvalue()


def build_settings(substitutions: Mapping[str, str]) -> Dict[str, str]:
    return {f"substitution {name}": str(value) for name, value in substitutions.items()}
