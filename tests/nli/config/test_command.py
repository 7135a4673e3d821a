"""nli/config/command.py: what the command line's check hands on to Hydra's main. Its refusals are tested by what
they refuse (tests/nli/config/test_keys.py, test_schema.py, tests/runs/test_console.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, List

import pytest
from hydra.core.global_hydra import GlobalHydra
from hydra.types import RunMode

from nli.config import command
from tests.support.runs import CONF, FAST, run_app


@pytest.fixture
def compositions(monkeypatch: pytest.MonkeyPatch) -> List[RunMode]:
    """The mode of each composition of the whole config in this process, in order."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    modes: List[RunMode] = []
    compose = ConfigLoaderImpl.load_configuration

    def counted(self: ConfigLoaderImpl, config_name: str, overrides: List[str], run_mode: RunMode,
                *args: Any, **kwargs: Any) -> Any:
        modes.append(run_mode)
        return compose(self, config_name, overrides, run_mode, *args, **kwargs)

    monkeypatch.setattr(ConfigLoaderImpl, "load_configuration", counted)
    return modes


def test_a_run_composes_its_config_twice_the_checks_and_the_runs(compositions: List[RunMode],
                                                                 tmp_path: Path) -> None:
    """Hydra's main composed the config a third time, only to read hydra.mode (Hydra.get_mode: in MULTIRUN mode)."""
    proc = run_app(FAST, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert compositions == [RunMode.RUN, RunMode.RUN]


def test_a_sweep_is_composed_as_hydra_composes_it(compositions: List[RunMode], tmp_path: Path) -> None:
    """A sweep's check composes no whole run, so Hydra asks for the mode itself, as before."""
    proc = run_app(["-m", *FAST, "seed=1", f"hydra.sweep.dir={tmp_path / 'sweep'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert compositions.count(RunMode.MULTIRUN) == 2  # Hydra's to read the mode, then the sweep's


@pytest.mark.parametrize("typed", [[], ["hydra.mode=RUN"], ["hydra.mode=MULTIRUN"]])
def test_the_mode_handed_to_hydra_is_the_one_hydra_reads(typed: List[str]) -> None:
    overrides = ["experiment=quickstart", *typed]
    checked = command.check(overrides, CONF, "train")
    assert checked.composed
    assert checked.mode == GlobalHydra.instance().hydra.get_mode("train", overrides)  # type: ignore[union-attr]


@pytest.mark.parametrize("typed, extra", [
    (["output_dir=runs/a"], ["hydra.run.dir=runs/a"]),  # Hydra's log with the run's other files
    (["output_dir=runs/a", "hydra.run.dir=logs/a"], []),  # typed: Hydra's where it says
    (["output_dir=runs/a", "hydra.job.chdir=true"], []),  # output_dir is relative to Hydra's, which it changes into
    (["output_dir=gs://bucket/a"], []),  # Hydra writes on local disk; the loggers' copies go to the bucket
    (["output_dir="], []),  # unset: Hydra's default folder
])
def test_a_local_output_dir_is_hydras_run_directory(typed: List[str], extra: List[str], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)  # the check tries the folder's writability where Hydra will make it
    assert command.check(["experiment=quickstart", *typed], CONF, "train").extra == extra
