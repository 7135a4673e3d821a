"""The training image, without a Docker engine: the Dockerfile parses as Docker reads it, copies
what exists and is not ignored into the layout of this repository, and its entry point, run as
`docker run IMAGE ARGS` would run it, trains and writes results."""

from __future__ import annotations

import io
import json
import posixpath
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Dict, List

import pytest
import yaml
from docker.utils.build import PatternMatcher
from dockerfile_parse import DockerfileParser

from tests.support.runs import FAST, ROOT, process_env, read_results


@pytest.fixture(scope="module")
def dockerfile() -> DockerfileParser:
    return DockerfileParser(path=str(ROOT / "Dockerfile"))


def _instructions(dockerfile: DockerfileParser, name: str) -> List[str]:
    return [item["value"] for item in dockerfile.structure if item["instruction"] == name]


def _stages(dockerfile: DockerfileParser) -> Dict[str, List[dict]]:
    """Each build stage's instructions (its FROM first), by the name its FROM gives it, in order."""
    stages: Dict[str, List[dict]] = {}
    for item in dockerfile.structure:
        if item["instruction"] == "FROM":
            words = item["value"].split()
            stage: List[dict] = []
            stages[words[-1] if len(words) == 3 and words[1].upper() == "AS" else str(len(stages))] = stage
        if stages:
            stage.append(item)
    return stages


def _target(dockerfile: DockerfileParser, name: str) -> DockerfileParser:
    """The Dockerfile as `docker build --target NAME` reads it: every line up to the end of that stage
    (the stages after it play no part), so that `envs`, `args` and `baseimage` are the target's."""
    stages = _stages(dockerfile)
    names = list(stages)
    following = names.index(name) + 1
    end = stages[names[following]][0]["startline"] if following < len(names) else len(dockerfile.lines)
    return DockerfileParser(fileobj=io.BytesIO("".join(dockerfile.lines[:end]).encode()))


def _project() -> dict:
    # Python 3.11's, as in both images: the requirements stage reads pyproject.toml with it too.
    tomllib = pytest.importorskip("tomllib", reason="the requirements stage runs on Python 3.11")
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def _pins(path: Path) -> List[str]:
    """A requirements file's requirements, without comments and blank lines."""
    return [line.split("#")[0].strip() for line in path.read_text().splitlines() if line.split("#")[0].strip()]


def _build_stage(stage: List[dict], root: Path) -> None:
    """A stage that only reads the build context and runs Python, built into `root` (its `/`): WORKDIR,
    COPY from the context and RUN, run by a shell with this interpreter as its `python`."""
    bin_dir = root / ".bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").symlink_to(sys.executable)
    workdir = root
    for item in stage[1:]:
        if item["instruction"] == "WORKDIR":
            workdir = root / item["value"].lstrip("/")
            workdir.mkdir(parents=True, exist_ok=True)
        elif item["instruction"] == "COPY":
            *sources, dest = item["value"].split()
            for source in sources:
                target = workdir / dest / Path(source).name if dest.endswith("/") else workdir / dest
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy(ROOT / source, target)
        elif item["instruction"] == "RUN":
            env = {"PATH": f"{bin_dir}:/usr/bin:/bin"}
            proc = subprocess.run(["/bin/sh", "-c", item["value"]], cwd=workdir, env=env, capture_output=True,
                                  text=True)
            assert proc.returncode == 0, proc.stderr
        elif item["instruction"] != "COMMENT":
            raise AssertionError(f"{item['instruction']} in a stage the test builds: extend _build_stage")


def _installed(stage: List[dict], built: Path) -> List[str]:
    """What an image stage pip-installs -r: the file it copies from the built requirements stage."""
    copies = [item["value"].split() for item in stage if item["instruction"] == "COPY"
              and item["value"].startswith("--from=requirements ")]
    ((_, source, dest),) = copies
    runs = [item["value"] for item in stage if item["instruction"] == "RUN"]
    assert any(f"python -m pip install -r {dest}" in run for run in runs), f"nothing installs {dest}"
    return _pins(built / source.lstrip("/"))


def _workdir(dockerfile: DockerfileParser) -> str:
    workdirs = _instructions(dockerfile, "WORKDIR")
    assert workdirs, "no WORKDIR: the entry point's relative train.py would depend on the base image"
    return workdirs[-1]


def _entrypoint(dockerfile: DockerfileParser) -> List[str]:
    entrypoints = _instructions(dockerfile, "ENTRYPOINT")
    assert entrypoints, "no ENTRYPOINT"
    # Exec form (a JSON list): container args are appended as Hydra overrides, and the signals of
    # `docker stop` and Vertex AI reach python itself, not a shell that would swallow them.
    entrypoint = json.loads(entrypoints[-1])
    assert isinstance(entrypoint, list) and all(isinstance(arg, str) for arg in entrypoint)
    return entrypoint


def _dockerignore() -> PatternMatcher:
    """.dockerignore as Docker reads it (docker-py's own matcher, the one `docker build` from Python uses)."""
    lines = (ROOT / ".dockerignore").read_text().splitlines()
    return PatternMatcher([line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")])


def test_dockerfile_structure(dockerfile: DockerfileParser) -> None:
    assert _instructions(dockerfile, "FROM"), "no FROM"
    assert ":" in dockerfile.baseimage and not dockerfile.baseimage.endswith(":latest"), \
        f"pin the base image to a tag: {dockerfile.baseimage}"
    assert _workdir(dockerfile).startswith("/")
    assert _entrypoint(dockerfile)[0] == "python"
    assert dockerfile.envs.get("PYTHONUNBUFFERED") == "1"  # logs reach Cloud Logging line by line


def test_copy_sources_exist_are_not_ignored_and_keep_the_repository_layout(dockerfile: DockerfileParser) -> None:
    """Every COPY source is in the build context, and lands where it lies in the repository,
    relative to its stage's WORKDIR: so running the entry point from the repository root, as the
    next test does, runs what each image runs. A COPY --from takes a file of an earlier stage."""
    ignore = _dockerignore()
    stages = _stages(dockerfile)
    for name, stage in stages.items():
        workdirs = [item["value"] for item in stage if item["instruction"] == "WORKDIR"]
        workdir, copied = "/", set()
        for item in stage:
            if item["instruction"] == "WORKDIR":
                workdir = posixpath.join(workdir, item["value"])
            if item["instruction"] != "COPY":
                continue
            words = item["value"].split()
            if words[0].startswith("--from="):
                assert list(stages).index(words[0].split("=", 1)[1]) < list(stages).index(name), item["value"]
                continue
            *sources, dest = [word for word in words if not word.startswith("--")]  # flags: --chown, --chmod
            for source in sources:
                path = ROOT / source
                assert path.exists(), f"COPY {source}: not in the repository"
                assert not ignore.matches(source.rstrip("/")), f"COPY {source}: excluded by .dockerignore"
                if path.is_dir():  # Docker copies a folder's contents into dest
                    target = posixpath.join(workdir, dest)
                    for file in path.rglob("*"):
                        relative = file.relative_to(ROOT).as_posix()
                        if file.suffix in (".py", ".yaml"):
                            assert not ignore.matches(relative), f"{relative}: excluded by .dockerignore"
                else:
                    target = posixpath.join(workdir, dest, path.name) if dest.endswith("/") or len(sources) > 1 \
                        else posixpath.join(workdir, dest)
                assert posixpath.normpath(target) == posixpath.join(workdirs[-1], source.rstrip("/")), \
                    f"{name}: COPY {source} {dest}: lands at {target}, not where the repository has it"
                copied.add(source.rstrip("/"))
        if any(item["instruction"] == "ENTRYPOINT" for item in stage):  # an image, not a helper stage
            assert {"conf", "nli", "launch", "train.py", "pyproject.toml", "README.md"} <= copied, name


@pytest.mark.process
def test_entrypoint_runs_the_quickstart(dockerfile: DockerfileParser, tmp_path: Path) -> None:
    """`docker run IMAGE <overrides>`: the exec-form entry point with the overrides appended, in the
    WORKDIR (here the repository root, which the test above shows has the image's layout), under the
    image's ENV."""
    entrypoint = _entrypoint(dockerfile)
    # The image's `python` is the interpreter the project is installed into; here that is the one
    # running the tests, which a `python` on PATH need not be (a venv not activated, python3 only).
    command = [sys.executable if entrypoint[0] == "python" else entrypoint[0], *entrypoint[1:]]
    env = process_env(dockerfile.envs)
    out = tmp_path / "out"
    # hydra.run.dir: Hydra's own files (.hydra/, train.log) would otherwise land in the repository.
    args = [*FAST, f"output_dir={out}", f"hydra.run.dir={tmp_path / 'hydra'}"]
    proc = subprocess.run([*command, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    objective = read_results(out)["objective"]
    assert isinstance(objective, (int, float)) and not isinstance(objective, bool)
    assert (out / "config.yaml").is_file() and (out / "model").is_dir()


@pytest.mark.process
def test_the_reduction_server_plugin_is_built_in_only_when_asked(dockerfile: DockerfileParser, tmp_path: Path) -> None:
    """The RUN step behind `--build-arg REDUCTION_SERVER=1`, run by a shell as Docker runs it, with
    apt-get, curl and gpg replaced by recorders and the system folders by temporary ones."""
    assert dockerfile.args.get("REDUCTION_SERVER") == "0"
    step = next(value for value in _instructions(dockerfile, "RUN") if "REDUCTION_SERVER" in value)
    bin_dir, etc, keyrings = tmp_path / "bin", tmp_path / "sources.list.d", tmp_path / "keyrings"
    for folder in (bin_dir, etc, keyrings):
        folder.mkdir()
    calls = tmp_path / "calls"
    for tool in ("apt-get", "curl", "gpg"):
        (bin_dir / tool).write_text(f'#!/bin/sh\necho "{tool} $*" >> {calls}\n')
        (bin_dir / tool).chmod(0o755)
    script = step.replace("/etc/apt/sources.list.d/", f"{etc}/").replace("/usr/share/keyrings/", f"{keyrings}/")
    for flag, installs in (("0", False), ("1", True)):
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "REDUCTION_SERVER": flag}
        proc = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        assert calls.exists() == installs
    assert "apt-get install -y --no-install-recommends google-reduction-server" in calls.read_text()
    assert "packages.cloud.google.com/apt google-fast-socket main" in (etc / "google-fast-socket.list").read_text()


def test_cloud_build_builds_the_dockerfile_and_pushes_its_image(dockerfile: DockerfileParser) -> None:
    """cloudbuild.yaml, as `gcloud builds submit --config cloudbuild.yaml` reads it."""
    build = yaml.safe_load((ROOT / "cloudbuild.yaml").read_text())
    (step,) = build["steps"]
    assert step["name"] == "gcr.io/cloud-builders/docker" and step["args"][0] == "build" and step["args"][-1] == "."
    flags = [arg.split("=", 1) for arg in step["args"] if arg.startswith("--")]
    assert ["--file", "Dockerfile"] in flags and (ROOT / "Dockerfile").is_file()
    (tag,) = [value for flag, value in flags if flag == "--tag"]
    assert build["images"] == [tag] == ["${_IMAGE}:${_TAG}"]  # what it builds is what it pushes
    # Every build argument is one the Dockerfile declares, with the Dockerfile's default.
    build_args = dict(value.split("=", 1) for flag, value in flags if flag == "--build-arg")
    declared = dict(arg.split("=", 1) for arg in _instructions(dockerfile, "ARG"))  # before FROM too
    assert set(build_args) == set(declared) == {"BASE_IMAGE", "TPU_BASE_IMAGE", "REDUCTION_SERVER"}
    substitutions = build["substitutions"]
    assert {name: substitutions[value[2:-1]] for name, value in build_args.items()} == declared
    # It builds the default image unless told otherwise (_TARGET=tpu), and the target is a stage.
    (target,) = [value for flag, value in flags if flag == "--target"]
    assert substitutions[target[2:-1]] == list(_stages(dockerfile))[-1] == "cuda"
    assert "tpu" in _stages(dockerfile)
    # User substitutions start with an underscore, and each one used is defined.
    used = set(re.findall(r"\$\{(_[A-Z_]+)\}", (ROOT / "cloudbuild.yaml").read_text()))
    assert used == set(substitutions) and all(name.startswith("_") for name in substitutions)
    assert substitutions["_IMAGE"].startswith("us-central1-docker.pkg.dev/${PROJECT_ID}/")
    assert build["options"]["dynamicSubstitutions"] is True  # ${PROJECT_ID} inside _IMAGE
    # gcloud uploads the Dockerfile and everything it copies.
    ignored = [line for line in (ROOT / ".gcloudignore").read_text().splitlines() if line and line[0] != "#"]
    matcher = PatternMatcher([line.rstrip("/") for line in ignored])
    for needed in ["Dockerfile", *(source for line in _instructions(dockerfile, "COPY") if "--from=" not in line
                                   for source in line.split()[:-1] if not source.startswith("--"))]:
        assert not matcher.matches(needed), needed


# ------------------------------------------------------------------------------ the images' targets


def test_the_default_target_is_the_cuda_image_of_the_torch_pin(dockerfile: DockerfileParser, tmp_path: Path) -> None:
    """`docker build .` builds the last stage: PyTorch's CUDA image of the project's torch, with every
    pin of pyproject.toml and the vertex extra, and nothing of the TPU image."""
    (torch_pin,) = [pin for pin in _project()["dependencies"] if pin.startswith("torch==")]
    assert list(_stages(dockerfile))[-1] == "cuda"
    assert dockerfile.baseimage.startswith(f"pytorch/pytorch:{torch_pin.split('==')[1]}-cuda")
    assert "PJRT_DEVICE" not in dockerfile.envs and dockerfile.args == {"REDUCTION_SERVER": "0"}
    _build_stage(_stages(dockerfile)["requirements"], tmp_path)
    project = _project()
    assert _installed(_stages(dockerfile)["cuda"], tmp_path) == [*project["dependencies"],
                                                                  *project["optional-dependencies"]["vertex"]]


def test_the_tpu_target_installs_torch_xla_with_libtpu_in_place_of_the_torch_pin(
        dockerfile: DockerfileParser, tmp_path: Path) -> None:
    """`docker build --target tpu`: plain Python 3.11, requirements/tpu.txt's torch and torch-xla (with its
    `tpu` extra, which brings libtpu), every other project pin, PJRT on the TPU, and the CUDA image's user,
    directory and entry point."""
    tpu = _target(dockerfile, "tpu")
    assert re.fullmatch(r"python:3\.11[.\d]*-slim(-\w+)?", tpu.baseimage), tpu.baseimage
    assert tpu.envs["PJRT_DEVICE"] == "TPU"
    assert {key: tpu.envs[key] for key in dockerfile.envs} == dockerfile.envs  # unbuffered logs and the rest
    for instruction in ("USER", "WORKDIR", "ENTRYPOINT"):
        assert _instructions(tpu, instruction)[-1] == _instructions(dockerfile, instruction)[-1], instruction
    _build_stage(_stages(dockerfile)["requirements"], tmp_path)
    installed = _installed(_stages(dockerfile)["tpu"], tmp_path)
    xla = [pin.replace("torch-xla==", "torch-xla[tpu]==") for pin in _pins(ROOT / "requirements" / "tpu.txt")]
    assert {"torch-xla[tpu]", "torch"} <= {pin.split("==")[0] for pin in xla}
    project = _project()
    others = [pin for pin in project["dependencies"] if not pin.startswith("torch==")]
    assert installed == [*xla, *others, *project["optional-dependencies"]["vertex"]]
    assert len(others) == len(project["dependencies"]) - 1  # only the torch pin gave way
