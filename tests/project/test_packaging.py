"""The project as a user installs it: ``python -m build`` makes the sdist and, from it, the wheel, without a
warning; both carry every config file and the Vertex launcher; and the wheel, installed into a new virtual
environment, runs ``python -m nli`` from any directory with all its config groups and finds the launcher.

The build and the installed project run in processes of their own, as a user's do (about half a minute in
all, most of it the quickstart's run)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import tarfile
import tomllib
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Set

import pytest

from tests.support.runs import CONF, FAST, ROOT, process_env, read_results

pytestmark = pytest.mark.process

# What the build reads: pyproject.toml, the files it names, and the package folders. Copied out of the
# checkout, so that the build's own folders (build/, *.egg-info) land in the test's folder, not in the
# checkout beside a concurrent build of it (test_vertex.py's python_package job builds its sdist there).
SOURCES = ["pyproject.toml", "README.md", "nli", "conf", "launch"]


@dataclass
class Build:
    sdist: Path
    wheel: Path
    output: str  # what `python -m build` printed, standard error included


def shipped_sources() -> Dict[str, Path]:
    """Every file the installed project needs, by its path inside the wheel: nli's modules, the config as
    nli/conf, and the launcher in Hydra's plugin namespace."""
    files = {f"nli/{path.relative_to(ROOT / 'nli')}": path for path in (ROOT / "nli").rglob("*.py")}
    files |= {f"nli/conf/{path.relative_to(CONF)}": path for path in CONF.rglob("*.yaml") if not _users(path)}
    plugins = ROOT / "launch"
    files |= {str(path.relative_to(plugins)): path for path in (plugins / "hydra_plugins").rglob("*.py")}
    return files


def _users(path: Path) -> bool:
    """A file of a user's own, which git ignores and no package ships: conf/local/ (docs/vertex.md)."""
    return path.relative_to(CONF).parts[0] == "local"


def config_groups() -> Dict[str, Set[str]]:
    """conf/'s groups (model/peft included) and their options."""
    groups: Dict[str, Set[str]] = {}
    for path in CONF.rglob("*.yaml"):
        if path.parent != CONF and not _users(path):
            groups.setdefault(str(path.parent.relative_to(CONF)), set()).add(path.stem)
    return groups


def clean_env() -> Dict[str, str]:
    """The suite's environment less a PYTHONPATH, which may point at the checkout: the installed project, and
    only it, is imported."""
    env = process_env()
    env.pop("PYTHONPATH", None)
    return env


@pytest.fixture(scope="module")
def build(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """``python -m build``: the sdist, then the wheel built from the unpacked sdist, as pip builds one from
    PyPI. --no-isolation: setuptools from this environment (the vertex extra pins it), no download."""
    tmp = tmp_path_factory.mktemp("build")
    source, dist = tmp / "source", tmp / "dist"
    source.mkdir()
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(ROOT / name, source / name)
    env = clean_env()
    # A shell's PYTHONDONTWRITEBYTECODE makes setuptools warn that it skips byte-compiling: the shell's
    # warning, not the project's.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    proc = subprocess.run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(source)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (sdist,), (wheel,) = dist.glob("*.tar.gz"), dist.glob("*.whl")
    return Build(sdist, wheel, proc.stdout + proc.stderr)


@pytest.fixture(scope="module")
def installed(build: Build, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A new virtual environment with the wheel installed: its Python. The dependencies (torch, ...) come from
    this environment's site-packages, added after the new one's own, where the wheel's nli and launcher are.
    (Not --system-site-packages: from a virtual environment, that would reach the base Python's, not this one's.)"""
    venv = tmp_path_factory.mktemp("venv") / "env"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    own = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                         check=True, capture_output=True, text=True).stdout.strip()
    dependencies = [path for path in sys.path if Path(path).name in ("site-packages", "dist-packages")]
    (Path(own) / "dependencies.pth").write_text(f"import site; list(map(site.addsitedir, {dependencies!r}))\n")
    proc = subprocess.run([str(python), "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", str(build.wheel)],
                          cwd=venv, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return python


def nli(python: Path, args: List[str], cwd: Path) -> subprocess.CompletedProcess:
    """``python -m nli ARGS`` with the installed project, from ``cwd``."""
    return subprocess.run([str(python), "-m", "nli", *args], cwd=cwd, env=clean_env(), capture_output=True,
                          text=True, timeout=600)


def test_the_build_warns_nothing(build: Build) -> None:
    """setuptools warns about each config folder not declared a package, ten warnings of thirty lines each."""
    warnings = [line for line in build.output.splitlines() if "warn" in line.lower()]
    assert not warnings, build.output[-5000:]


def test_the_sdist_and_the_wheel_carry_every_config_file_and_the_launcher(build: Build) -> None:
    """The wheel, built from the sdist, proves the sdist whole too: its files, where the wheel has them."""
    expected = shipped_sources()
    with zipfile.ZipFile(build.wheel) as wheel:
        missing = set(expected) - set(wheel.namelist())
        assert not missing, f"not in the wheel (a folder not declared in pyproject.toml's packages?): {missing}"
        assert all(wheel.read(name) == path.read_bytes() for name, path in expected.items())
    with tarfile.open(build.sdist) as sdist:
        top = sdist.getnames()[0].split("/")[0]  # nli_glue-0.1.0/
        in_sdist = {name.removeprefix(f"{top}/") for name in sdist.getnames()}
    checkout = {str(path.relative_to(ROOT)) for path in expected.values()}
    assert checkout - in_sdist == set()


# What the installed environment imports: nli, and the Vertex launcher as Hydra's plugin discovery finds it.
WHERE = """
import inspect, nli
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
print(nli.__file__)
print(*[inspect.getfile(cls) for cls in Plugins.instance().discover(Launcher) if cls.__name__ == "VertexLauncher"])
"""


def test_the_installed_wheel_trains_the_quickstart_from_another_directory(installed: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    proc = nli(installed, [*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_results(run_dir)["status"] == "completed"
    assert read_results(run_dir)["train_steps"] == 12


def test_the_installed_wheel_lists_every_config_group_and_finds_the_launcher(installed: Path, tmp_path: Path) -> None:
    """`--help` lists conf/'s groups with their options; Hydra discovers the wheel's launcher in its plugin
    namespace (not one of this environment's), lists it among hydra/launcher's options, and composes it."""
    where = subprocess.run([str(installed), "-c", WHERE], cwd=tmp_path, env=clean_env(), capture_output=True,
                           text=True, timeout=120)
    assert where.returncode == 0, where.stderr
    files = where.stdout.split()
    assert len(files) == 2 and all(Path(file).is_relative_to(installed.parents[1]) for file in files), where.stdout
    app_help = nli(installed, ["--help"], cwd=tmp_path)
    assert app_help.returncode == 0, app_help.stderr
    groups = app_help.stdout.split("== Configuration groups ==")[1].split("== Config ==")[0]
    listed = {group: set(options.split(", ")) for group, options in re.findall(r"^([\w/]+): (.+)$", groups, re.M)}
    run_groups = {group: options for group, options in config_groups().items() if not group.startswith("hydra/")}
    assert listed == run_groups  # Hydra's own groups (the launcher presets) are --hydra-help's, below
    hydra_help = nli(installed, ["--hydra-help"], cwd=tmp_path)
    launchers = re.search(r"^hydra/launcher: (.+)$", hydra_help.stdout, re.M)
    assert launchers and {"basic", "vertex", "submitit_slurm", *config_groups()["hydra/launcher"]} <= \
        set(launchers[1].split(", ")), hydra_help.stdout
    vertex = nli(installed, ["hydra/launcher=vertex", "--cfg", "hydra", "--package", "hydra.launcher"], cwd=tmp_path)
    assert vertex.returncode == 0, vertex.stderr
    assert "_target_: hydra_plugins.vertex_launcher.vertex_launcher.VertexLauncher" in vertex.stdout


def test_every_pin_runs_on_the_oldest_python_the_project_says_it_runs_on() -> None:
    """requires-python is what a user's pip reads before anything else: each pinned package's own Requires-Python
    must admit the oldest Python it allows. With ">=3.10", pip on Python 3.10 found no transformers 5.23 (it
    asks for 3.11) and said so of transformers instead of naming the Python."""
    from importlib.metadata import metadata, version

    from packaging.requirements import Requirement
    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    ours = SpecifierSet(project["requires-python"])
    oldest = next(f"3.{minor}.0" for minor in range(30) if ours.contains(f"3.{minor}.0"))
    pins = [Requirement(line) for group in [project["dependencies"], *project["optional-dependencies"].values()]
            for line in group]
    refused = {}
    for pin in pins:
        if pin.name == project["name"]:  # an extra naming others (test: vertex and bench)
            continue
        installed = Version(version(pin.name)).public  # torch's CPU build: 2.13.0+cpu
        assert pin.specifier == SpecifierSet(f"=={installed}"), f"{pin.name} {installed} is installed, not {pin}"
        needs = metadata(pin.name).get("Requires-Python")
        if needs and not SpecifierSet(needs).contains(oldest):
            refused[str(pin)] = needs
    assert not refused, f"requires-python {ours} admits Python {oldest}, which these pins refuse: {refused}"
    floor = oldest.removesuffix(".0")
    assert f"On a fresh machine with Python {floor}+ " in (ROOT / "README.md").read_text()  # the quick start says it
