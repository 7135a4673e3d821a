"""A run's local data paths are checked from its config before anything loads (nli/config/paths.py): a missing folder
or file stops the command in a fraction of a second, with the message the loading itself gives, where it was found
only as the data loaded (8 s in; a Slurm job's after its queue wait). Each job of a sweep, and a search's data, too."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import List

import pytest

from nli.config import paths
from nli.config.command import check, compose
from nli.data import sources
from nli.errors import DataError
from tests.support.runs import CONF, GLUE_DATA, slurm_commands

TINY_RTE = ["model=tiny", "task=rte", "hw=cpu"]


def refusal(args: List[str]) -> str:
    """What the command line says of ``args``, which it must refuse."""
    with pytest.raises(SystemExit) as refused:
        check(args, CONF, "train")
    return str(refused.value.code)


def rte_dir(root: Path, *files: str) -> Path:
    """A GLUE directory holding RTE's ``files`` alone."""
    (root / "RTE").mkdir(parents=True)
    for name in files:
        shutil.copy(GLUE_DATA / "RTE" / name, root / "RTE" / name)
    return root


def test_a_missing_glue_folder_is_refused_with_the_loadings_own_message(tmp_path: Path) -> None:
    glue = tmp_path / "glue_data"
    typed = [*TINY_RTE, f"data.dir={glue}", f"hydra.run.dir={tmp_path / 'run'}"]
    said = refusal(typed)
    assert said == (f"error: data.dir={glue}: {glue / 'RTE'} does not exist. A GLUE directory holds one folder per "
                    "task (RTE/ for rte) with the files dev.tsv, train.tsv, as the original GLUE download lays them "
                    "out: put them there, or set data.dir=null to load rte from the Hub (nyu-mll/glue)")
    assert not (tmp_path / "run").exists()
    cfg = compose(typed[:-1])  # from Python the paths are the loading's: the same words, as it reads them
    with pytest.raises(DataError) as loading:
        sources.load(cfg.task, cfg.data, paths.run_splits(cfg))
    assert said == f"error: {loading.value}"


def test_each_file_the_run_reads_and_only_those(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The training file unless the run only evaluates; the test file where it predicts."""
    monkeypatch.chdir(tmp_path)
    rte_dir(tmp_path / "dev_only", "dev.tsv")
    assert "RTE/train.tsv does not exist" in refusal([*TINY_RTE, "data.dir=dev_only"])
    # A relative path is said with the folder it was looked for from.
    assert f"dev_only/RTE/train.tsv does not exist (looked for from {tmp_path})" in \
        refusal([*TINY_RTE, "data.dir=dev_only"])
    assert check(["eval.only=true", "model=roberta-base", "task=rte", "hw=cpu", "data.dir=dev_only"], CONF,
                 "train").composed  # an evaluation reads no training file
    rte_dir(tmp_path / "no_test", "train.tsv", "dev.tsv")
    assert check([*TINY_RTE, "data.dir=no_test"], CONF, "train").composed
    assert "no_test/RTE/test.tsv does not exist" in refusal([*TINY_RTE, "data.dir=no_test", "train.predict=true"])


def test_the_tasks_folder_for_the_glue_directory_is_named_with_the_fix(tmp_path: Path) -> None:
    rte = rte_dir(tmp_path / "glue_data", "train.tsv", "dev.tsv") / "RTE"
    assert refusal([*TINY_RTE, f"data.dir={rte}"]) == (
        f"error: data.dir={rte}: {rte / 'RTE'} does not exist, and {rte / 'train.tsv'} does: data.dir names the "
        f"folder that holds RTE/, not RTE/ itself. Set data.dir={tmp_path / 'glue_data'}")


def test_files_of_your_own_and_the_extra_sets_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(GLUE_DATA / "RTE" / "dev.tsv", tmp_path / "dev.tsv")
    own = [*TINY_RTE, "+data.files.train=train.tsv", "+data.files.validation=dev.tsv"]
    assert refusal(own) == f"error: data.files: train.tsv does not exist (looked for from {tmp_path})"
    assert refusal([*own[:-2], "+data.files.train=dev.tsv", "+data.files.validation=dev.txt"]) == (
        "error: data.files: dev.txt is not one of the formats ['.csv', '.json', '.jsonl', '.parquet', '.tsv']")
    sets = tmp_path / "sets"
    (sets / "hans").mkdir(parents=True)
    assert refusal([*TINY_RTE, f"data.dir={GLUE_DATA}", "eval.extra=[hans]", f"eval.dir={sets}"]).startswith(
        f"error: eval.dir={sets}: {sets / 'hans' / 'heuristics_evaluation_set.txt'} does not exist. eval.dir holds "
        "each set's original download")


def test_the_formats_checked_are_the_formats_read() -> None:
    assert sorted(paths.FILE_SUFFIXES) == sorted(sources.FILE_FORMATS)


def test_a_typo_in_one_job_of_a_sweep_stops_it_before_any_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    sweep = tmp_path / "sweep"
    said = refusal(["-m", *TINY_RTE, f"data.dir={GLUE_DATA},glue_dat", f"hydra.sweep.dir={sweep}"])
    assert said.startswith(f"error: the sweep's job data.dir=glue_dat would stop as it starts: data.dir=glue_dat: "
                           f"glue_dat/RTE does not exist (looked for from {tmp_path}). A GLUE directory holds")
    assert said.endswith("No job has run: mend the value, or drop it from the sweep") and not sweep.exists()
    # Under submitit's local launcher too: its jobs run on this machine.
    assert "would stop as it starts" in refusal(["-m", "hydra/launcher=submitit_local", *TINY_RTE,
                                                 f"data.dir={GLUE_DATA},glue_dat"])


def test_a_search_whose_data_is_missing_runs_no_trial(tmp_path: Path) -> None:
    said = refusal(["-m", "hparams_search=quickstart", "task=rte", f"data.dir={tmp_path / 'nope'}", "hw=cpu",
                    f"hydra.sweep.dir={tmp_path / 'search'}"])
    assert said.startswith(f"error: every trial of the search would stop as it starts: data.dir={tmp_path / 'nope'}: ")
    assert said.endswith("No trial has run") and not (tmp_path / "search").exists()
    # Where the search draws the task, each trial's data is its own: the trials check it as they start.
    assert check(["-m", "hparams_search=quickstart", "task=choice(rte,wnli)", f"data.dir={tmp_path / 'nope'}",
                  "hw=cpu", f"hydra.sweep.dir={tmp_path / 'search'}"], CONF, "train").extra == []


def test_a_slurm_sweep_is_warned_not_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    """A cluster's nodes may have a disk the login node lacks: the sweep goes on, said once per path."""
    monkeypatch.setenv("PATH", f"{slurm_commands(tmp_path / 'bin')}{os.pathsep}{os.environ['PATH']}")
    args = ["-m", "hydra/launcher=submitit_slurm", *TINY_RTE, "data.dir=/scratch/glue", "seed=1,2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert check(args, CONF, "train").extra == []
    err = capsys.readouterr().err
    assert err.count("warning: ") == 1 and err.startswith("warning: data.dir=/scratch/glue: /scratch/glue/RTE does not "
                                                          "exist. A GLUE directory holds")
    assert err.endswith("(on this machine; the sweep's jobs will read it on the cluster's nodes, and stop as they "
                        "start on a node without it)\n")
    # Where one job's path alone is not here, that job is named.
    check([*args[:-3], f"data.dir={GLUE_DATA},/scratch/glue", args[-1]], CONF, "train")
    assert capsys.readouterr().err.endswith("(on this machine; the sweep's job data.dir=/scratch/glue will read it on "
                                            "the cluster's nodes, and stop as it starts on a node without it)\n")


@pytest.mark.parametrize("where", [["hydra.job.chdir=true"], ["data.dir=gs://bucket/glue"]])
def test_paths_of_another_place_are_not_looked_for_here(where: List[str], tmp_path: Path) -> None:
    """A relative path where Hydra changes into each job's folder is of that folder; a bucket's is the loading's."""
    args = ["-m", *TINY_RTE, "data.dir=glue_data", *where, "seed=1,2", f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert check(args, CONF, "train").extra == []
    assert check([each for each in args[1:] if "seed" not in each and "sweep" not in each], CONF, "train").composed


def test_a_vertex_sweeps_local_paths_are_of_its_containers(tmp_path: Path) -> None:
    """data.dir=/gcs/<bucket>/... is Cloud Storage FUSE inside the job's container (docs/vertex.md)."""
    args = ["-m", "hydra/launcher=vertex", *TINY_RTE, "data.dir=/gcs/bucket/glue_data", "seed=1,2",
            f"hydra.sweep.dir={tmp_path / 'sweep'}"]
    assert check(args, CONF, "train").extra == []
    assert "/gcs/bucket/glue_data/RTE does not exist" in refusal(["-m", *args[2:]])


def test_a_local_checkpoint_that_is_not_there_is_refused_and_a_hub_id_is_left_to_the_hub(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A path meant as a local checkpoint (absolute, ./, ~, or deeper than owner/name) was found missing as the model
    loaded, 8 s in; a Hub id (owner/name) is the download's to answer."""
    monkeypatch.chdir(tmp_path)
    rte = ["model=roberta-base", "task=rte", "hw=cpu", f"data.dir={GLUE_DATA}"]
    assert refusal([*rte, f"model.name_or_path={tmp_path / 'roberta-bse'}"]) == (
        f"error: model.name_or_path={tmp_path / 'roberta-bse'} is not a directory; give a local checkpoint directory "
        "or a Hub id such as FacebookAI/roberta-base")
    assert refusal([*rte, "model.name_or_path=./ckpt"]).startswith(
        f"error: model.name_or_path=./ckpt is not a directory (looked for from {tmp_path});")
    assert "would stop as it starts: model.name_or_path=models/a/b is not a directory" in refusal(
        ["-m", *rte, "model.name_or_path=FacebookAI/roberta-base,models/a/b"])
    assert check([*rte, "model.name_or_path=FacebookAI/roberta-bse"], CONF, "train").composed
    (tmp_path / "ckpt").mkdir()
    assert check([*rte, "model.name_or_path=./ckpt"], CONF, "train").composed
    # A folder is read as it is: a revision of it, which would be recorded and never read, is refused here too.
    assert refusal([*rte, "model.name_or_path=./ckpt", "model.revision=v2.0"]) == (
        "error: model.revision=v2.0 picks a branch, tag or commit of a Hub id, and model.name_or_path=./ckpt is a "
        "local folder, read as it is: drop model.revision, or give the Hub id")
