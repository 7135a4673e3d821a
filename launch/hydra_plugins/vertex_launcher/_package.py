"""packaging=python_package: the project's source distribution, built once per sweep and uploaded to
the staging bucket, for Vertex AI to pip-install on its prebuilt PyTorch image."""

from __future__ import annotations

import logging
from pathlib import Path

import fsspec

from ._checks import LaunchError

log = logging.getLogger(__name__)


def build_sdist(source_dir: Path, out_dir: Path) -> Path:
    """``python -m build --sdist --no-isolation``: the build backend of the environment that launches,
    which is the one the project was installed with."""
    from build import BuildException, ProjectBuilder

    if not (source_dir / "pyproject.toml").is_file():
        raise LaunchError(f"hydra.launcher.source_dir={source_dir} holds no pyproject.toml: point it at the project")
    try:
        return Path(ProjectBuilder(source_dir).build("sdist", out_dir))
    except BuildException as error:
        raise LaunchError(f"building the source distribution of {source_dir} failed: {error}") from None


def upload(local: Path, url: str) -> None:
    fs, path = fsspec.core.url_to_fs(url)
    fs.put_file(str(local), path)
    log.info("Uploaded %s to %s", local.name, url)
