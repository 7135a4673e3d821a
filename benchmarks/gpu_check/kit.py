"""The GPU check's kit: the wheels the offline GPU machines lack (requirements/gpu-check.txt), downloaded here
(``prepare``) and installed there (with pip, else unpacked by hand)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import List, Optional, Tuple

from benchmarks.gpu_check import ROOT
from benchmarks.gpu_check.subruns import last_line

REQUIREMENTS = ROOT / "requirements" / "gpu-check.txt"
KIT = ROOT / ".gpu-kit"
KIT_LIMIT = 64 * 2**20  # what a device run may carry beside the working tree
GPU_PYTHON = "3.12"  # the GPU machines' Python
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")



def pins(path: Path = REQUIREMENTS) -> List[str]:
    """The ``name==version`` lines of the kit's requirements, comments dropped."""
    lines = (line.split("#", 1)[0].strip() for line in path.read_text().splitlines())
    return [line for line in lines if line]


def wheel_name(pin: str) -> str:
    """The prefix of ``pin``'s wheel file: ``antlr4-python3-runtime==4.9.3`` -> ``antlr4_python3_runtime-4.9.3``."""
    name, version = pin.split("==")
    return f"{re.sub(r'[-_.]+', '_', name).lower()}-{version}"


def fetch(pin: str, dest: Path, python_version: str) -> Path:
    """One wheel for that Python on x86-64 Linux; a pure-Python wheel built here where the index holds
    only a source distribution (antlr4 4.9.3): pip download first, pip wheel if that finds nothing."""
    before = set(dest.glob("*.whl"))
    download = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                "--python-version", python_version, "--implementation", "cp",
                *[arg for platform in PLATFORMS for arg in ("--platform", platform)], "-d", str(dest), pin]
    if subprocess.run(download, capture_output=True, text=True).returncode != 0:
        build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", str(dest), pin],
                               capture_output=True, text=True)
        if build.returncode != 0:
            sys.exit(f"{pin}: neither a wheel nor a buildable source distribution:\n{build.stderr[-2000:]}")
    found = [w for w in dest.glob("*.whl") if w.name.lower().startswith(wheel_name(pin))]
    if not found:
        new = sorted(w.name for w in set(dest.glob("*.whl")) - before)
        sys.exit(f"{pin}: pip reported success but no wheel of it is in {dest} (new there: {new})")
    built = found[0]
    if "-none-any" not in built.name and f"cp{python_version.replace('.', '')}" not in built.name \
            and f"py{python_version.replace('.', '')}" not in built.name:
        sys.exit(f"{pin}: {built.name} is not for Python {python_version}")
    return built


def prepare(kit: Path, python_version: str) -> List[Path]:
    """The kit's wheels in ``kit/wheels``, stale ones removed; their total size printed."""
    dest = kit / "wheels"
    dest.mkdir(parents=True, exist_ok=True)
    wheels = [fetch(pin, dest, python_version) for pin in pins()]
    for stale in set(dest.glob("*.whl")) - set(wheels):
        stale.unlink()
    total = sum(w.stat().st_size for w in wheels)
    for wheel in sorted(wheels):
        print(f"{wheel.stat().st_size / 2**20:8.2f} MiB  {wheel.name}")
    print(f"{total / 2**20:8.2f} MiB  in all, {len(wheels)} wheels for Python {python_version} in {dest}")
    if total > KIT_LIMIT:
        sys.exit(f"the kit is {total / 2**20:.1f} MiB: more than the {KIT_LIMIT // 2**20} MiB a device run carries")
    return wheels


class KitError(Exception):
    """The kit could not be installed: the report says why, and the lines that need it fail naming what is missing."""


def install(kit: Path) -> Tuple[Optional[Path], str]:
    """The kit's wheels installed into ``kit/site-pyXY``, that folder (for PYTHONPATH) and how: with pip (no index, no
    dependencies), else, where pip fails or is missing (a virtual environment made without it), each wheel unpacked
    there (:func:`unpack`: the kit's wheels are pure Python). None where the kit holds no wheels (a machine whose
    environment has everything). Raises KitError where neither works, or the wheels are for another Python."""
    wheels = sorted((kit / "wheels").glob("*.whl"))
    if not wheels:
        return None, f"none: no wheels in {kit / 'wheels'} (the machine's own packages)"
    site = kit / f"site-py{sys.version_info.major}{sys.version_info.minor}"
    stamp = site / ".installed"
    names = "\n".join(w.name for w in wheels)
    if stamp.exists() and stamp.read_text() == names:
        return site, f"{len(wheels)} wheels, installed before into {site}"
    tag = f"py{sys.version_info.major}{sys.version_info.minor}"
    foreign = [w.name for w in wheels if re.search(r"-(py|cp)3\d+-", w.name) and f"-{tag}-" not in w.name
               and f"-cp{tag[2:]}-" not in w.name]
    if foreign:
        raise KitError(f"the kit in {kit} is for another Python than this {platform_python()}: {foreign}; `python "
                       f"-m benchmarks.gpu_check prepare --python-version {platform_python()}` makes one for it")
    shutil.rmtree(site, ignore_errors=True)
    try:
        pip = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                              "--no-compile", "--target", str(site), *map(str, wheels)], capture_output=True,
                             text=True, timeout=180)
        failed = pip.returncode != 0 and last_line(pip.stderr)
    except subprocess.TimeoutExpired:
        failed = "pip ran past 180 s"
    how = f"{len(wheels)} wheels, with pip, into {site}"
    if failed:
        shutil.rmtree(site, ignore_errors=True)
        try:
            for wheel in wheels:
                unpack(wheel, site)
        except (OSError, zipfile.BadZipFile) as error:
            raise KitError(f"installing the kit from {kit / 'wheels'} failed: pip: {failed}; unpacking the wheels: "
                           f"{type(error).__name__}: {error}") from error
        how = f"{len(wheels)} wheels, unpacked into {site} (pip: {failed})"
    stamp.write_text(names)
    return site, how


def unpack(wheel: Path, site: Path) -> None:
    """A pure-Python wheel installed by hand: its files into ``site``, those of its ``.data/purelib`` and
    ``.data/platlib`` too, its scripts and headers left out (nothing here runs them)."""
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            name = member.filename
            if ".data/" in name.split("/", 1)[0] + "/":
                parts = name.split("/", 2)
                if len(parts) < 3 or parts[1] not in ("purelib", "platlib"):
                    continue
                name = parts[2]
            target = (site / name).resolve()
            if not target.is_relative_to(site.resolve()):
                raise OSError(f"{wheel.name}: {member.filename} would land outside {site}")
            if member.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(archive.read(member))


def platform_python() -> str:
    return f"{sys.version_info.major}.{sys.version_info.minor}"


