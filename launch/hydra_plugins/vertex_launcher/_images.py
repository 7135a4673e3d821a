"""packaging=python_package: the prebuilt Vertex AI image the project's sdist is pip-installed on.

pip installs the project's dependencies on the image, its torch pin included: where the image's torch
is another version, pip replaces it with PyPI's wheel of the pinned one, built for the CUDA of its day,
which the image's older driver may not run (the Dockerfile's comment). So the image is the one of the
pinned torch, where Vertex AI has one; another is taken only when named, and one of Vertex's prebuilt
images of another torch only with ``replace_image_torch=true``, on purpose. A prebuilt image whose Python the
project's ``requires-python`` refuses (their names say it: ``.py310``) is refused before anything is built: pip
there would refuse the sdist, job after job."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any, Dict, Optional

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from ._checks import LaunchError
from .config import VertexLauncherConf

# Vertex AI's prebuilt PyTorch training images (GPU builds, which run CPU jobs too), by torch minor version:
# https://cloud.google.com/vertex-ai/docs/training/pre-built-containers
PREBUILT_PYTORCH = {
    "2.0": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-0.py310:latest",
    "2.1": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-1.py310:latest",
    "2.2": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-2.py310:latest",
    "2.3": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-3.py310:latest",
    "2.4": "us-docker.pkg.dev/vertex-ai/training/pytorch-gpu.2-4.py310:latest",
}
# A prebuilt image's name says its torch: .../training/pytorch-gpu.2-4.py310 (also -cpu, -xla, gcr.io's)
_PREBUILT_NAME = re.compile(r"/training/pytorch-[a-z]+\.(?P<major>\d+)-(?P<minor>\d+)\b")
_PREBUILT_PYTHON = re.compile(r"/training/pytorch-[a-z]+\.\d+-\d+\.py(?P<major>\d)(?P<minor>\d+)\b")  # .py310: 3.10
_CONTAINER = ("Use hydra.launcher.packaging=container with the project's Dockerfile (hydra.launcher.image_uri=IMAGE, "
              "docs/vertex.md)")


def executor_image(settings: VertexLauncherConf, source_dir: Path) -> str:
    """The executor image for the sdist of ``source_dir``, or LaunchError with the fix."""
    if not (source_dir / "pyproject.toml").is_file():
        raise LaunchError(f"hydra.launcher.source_dir={source_dir} holds no pyproject.toml: point it at the project")
    pinned = pinned_torch(source_dir)
    named = settings.executor_image_uri
    if named is None:
        image = PREBUILT_PYTORCH.get(_minor(pinned)) if pinned else None
        if image is None:
            raise LaunchError(f"hydra.launcher.packaging=python_package: {_pin(pinned, source_dir)}, and Vertex AI has "
                              f"no prebuilt PyTorch image of it (its images: torch {', '.join(PREBUILT_PYTORCH)}); on "
                              "another, pip would replace the image's torch with PyPI's wheel, built for a newer CUDA "
                              f"than the image's driver may run. {_CONTAINER}, or name an "
                              "image whose torch is that one: hydra.launcher.executor_image_uri=IMAGE")
        _check_python(image, source_dir, f"Vertex AI's prebuilt image of the pinned torch, {image},")
        return image
    _check_python(named, source_dir, f"hydra.launcher.executor_image_uri={named}")
    found = _PREBUILT_NAME.search(named)
    if found and pinned and f"{found['major']}.{found['minor']}" != _minor(pinned) and not settings.replace_image_torch:
        raise LaunchError(f"hydra.launcher.executor_image_uri={named} is Vertex AI's prebuilt image of torch "
                          f"{found['major']}.{found['minor']}, and {_pin(pinned, source_dir)}: pip would replace the "
                          "image's torch with PyPI's wheel, which may need a newer CUDA driver than the image has. "
                          f"{_CONTAINER}, or, knowing that, add "
                          "hydra.launcher.replace_image_torch=true")
    return named


def _check_python(image: str, source_dir: Path, what: str) -> None:
    """LaunchError where ``image`` is a prebuilt image whose Python the project's ``requires-python`` refuses."""
    found = _PREBUILT_PYTHON.search(image)
    needs = _required_python(source_dir)
    if found is None or needs is None or needs.contains(f"{found['major']}.{found['minor']}"):
        return
    raise LaunchError(f"{what} runs Python {found['major']}.{found['minor']}, and the project requires Python {needs} "
                      "(requires-python in pyproject.toml): pip there would refuse to install it. "
                      f"{_CONTAINER}, or name an image of a Python it takes: hydra.launcher.executor_image_uri=IMAGE")


def _required_python(source_dir: Path) -> Optional[SpecifierSet]:
    """The project's ``requires-python``; None where it says none (or the file cannot be read: building the sdist
    says what is wrong with it)."""
    try:
        needs = _project(source_dir).get("requires-python")
        return SpecifierSet(needs) if isinstance(needs, str) else None
    except InvalidSpecifier:
        return None


def _project(source_dir: Path) -> Dict[str, Any]:
    """pyproject.toml's [project] table; empty where the file cannot be read."""
    try:
        with open(source_dir / "pyproject.toml", "rb") as stream:
            return dict(tomllib.load(stream).get("project", {}))
    except (OSError, tomllib.TOMLDecodeError):
        return {}


def pinned_torch(source_dir: Path) -> Optional[Version]:
    """The version ``torch==X`` in the project's dependencies pins; None where it pins no single version."""
    for line in _project(source_dir).get("dependencies", []):
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        specs = list(requirement.specifier)
        if requirement.name == "torch" and len(specs) == 1 and specs[0].operator in ("==", "==="):
            try:
                return Version(specs[0].version)
            except InvalidVersion:
                return None
    return None


def _minor(version: Version) -> str:
    return f"{version.major}.{version.minor}"


def _pin(pinned: Optional[Version], source_dir: Path) -> str:
    return (f"the project pins torch=={pinned} (pyproject.toml)" if pinned else
            f"the project in {source_dir} pins no single torch version (torch==X.Y.Z in pyproject.toml)")
