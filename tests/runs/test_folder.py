"""A folder holds one run: asked again with other settings it refuses, listing them, and touches
nothing; what cannot change the result may change; a damaged best checkpoint never loses a finished
training. The real train.py, in this process; a run that holds the folder, in another."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import pytest
import yaml
from omegaconf import OmegaConf

from nli.config.identity import CONTINUABLE, differences, digest, identity, refuse
from tests.conftest import build_config, compose_config
from tests.support.runs import FAST, MEASURED, ROOT, copy_run, process_env, read_results, run_app

# Evaluated at steps 3, 6, 9, 12; at this learning rate the metric cannot move, so the first
# evaluation stays the best and the last two checkpoints are kept beside it.
STILL = [*FAST, "train.eval_every=3", "optimizer.lr=1e-9"]


def files(run_dir: Path) -> Dict[str, bytes]:
    """Every file of the run, but its log (each attempt appends to it) and Hydra's record of the command."""
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != "train.log" and ".hydra" not in p.parts}


def train(run_dir: Path, *args: str) -> str:
    proc = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture
def finished(shared_run: Callable[[str, Sequence[str]], Path]) -> Path:
    """The suite's short quickstart, finished (read only: tests change copies of it)."""
    return shared_run("fast", FAST)


def copy_of(run_dir: Path, tmp_path: Path) -> Path:
    return copy_run(run_dir, tmp_path / "run")


def test_results_carry_the_runs_identity(finished: Path) -> None:
    """results.json names the identity, every checkpoint holds it, and config.yaml gives the same."""
    results = read_results(finished)
    manifests = [json.loads(p.read_text()) for p in (finished / "checkpoints").glob("*/checkpoint.json")]
    from_config = identity(yaml.safe_load((finished / "config.yaml").read_text()))
    assert all(m["identity"] == from_config for m in manifests) and results["identity"] == digest(from_config)
    assert "optimizer.lr" in from_config and "seed" in from_config
    assert "train.log_every" not in from_config and "hw.accelerator" not in from_config


def test_a_finished_run_asked_again_with_other_settings_is_refused(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished, tmp_path)
    before = files(run_dir)
    proc = run_app([*FAST, "optimizer.lr=2e-3", "train.max_steps=14", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"{run_dir} holds a finished run with other settings:\n  optimizer.lr: 0.001 -> 0.002\n"
            "  train.max_steps: 12 -> 14\nNothing was changed.") in proc.stderr
    assert "only new values of train.epochs" in proc.stderr  # the learning rate cannot be continued with
    assert "To go on with that run, give the values it holds: optimizer.lr=0.001 train.max_steps=12;" in proc.stderr
    assert files(run_dir) == before


def test_a_finished_run_asked_again_with_the_same_settings_reports_its_results(finished: Path,
                                                                               tmp_path: Path) -> None:
    """Settings that cannot change the result (logging, checkpoints kept, the hardware) may differ."""
    run_dir = copy_of(finished, tmp_path)
    before = files(run_dir)
    output = train(run_dir, *FAST, "train.log_every=1", "train.keep_checkpoints=5", "hw=cpu", "logger=csv")
    assert "this run already finished" in output and files(run_dir) == before


@pytest.mark.parametrize("damage", ["not yaml", "empty", "cut short"])
def test_a_finished_run_without_checkpoints_whose_config_yaml_is_damaged_is_known_by_its_results(
        finished: Path, tmp_path: Path, damage: str) -> None:
    """A folder with no checkpoint to read the run's settings from (an evaluation-only run's, or one whose
    checkpoints were deleted to save room) and a damaged config.yaml: the same command ended in Hydra's traceback of
    a YAML ParserError (not yaml), refused the run with every key (empty) or as another run (cut short). results.json
    records the settings' digest: the same settings are answered from it; others are refused in one line."""
    run_dir = copy_of(finished, tmp_path)
    shutil.rmtree(run_dir / "checkpoints")
    config = (run_dir / "config.yaml").read_text()
    (run_dir / "config.yaml").write_text({"not yaml": "optimizer: {lr: [0.001\n", "empty": "",
                                          "cut short": config[:len(config) // 3].rsplit("\n", 1)[0] + "\n"}[damage])
    before = files(run_dir)
    output = train(run_dir, *FAST)
    assert "this run already finished" in output and files(run_dir) == before
    proc = run_app([*FAST, "optimizer.lr=2e-3", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr and "Nothing was changed" in proc.stderr, \
        proc.stderr
    assert files(run_dir) == before


def test_a_run_given_an_output_dir_keeps_its_log_there_attempt_after_attempt(tmp_path: Path) -> None:
    """train.log is with the run's other files in a local output_dir (Hydra's run directory moves there), each
    attempt's after the last; not in a folder of Hydra's own, outputs/<task>/<time>/, one for each attempt. A
    hydra.run.dir typed beside it keeps Hydra's log where it says."""
    run_dir, elsewhere = tmp_path / "mine", tmp_path / "hydra"
    first = run_app([*FAST, f"output_dir={run_dir}"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    log = (run_dir / "train.log").read_text()
    assert "results: objective=" in log and f"log               {run_dir / 'train.log'}" in log
    again = run_app([*FAST, f"output_dir={run_dir}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    both = (run_dir / "train.log").read_text()
    assert both.startswith(log) and "this run already finished" in both[len(log):]
    assert not (tmp_path / "outputs").exists()
    typed = run_app([*FAST, f"output_dir={run_dir}", f"hydra.run.dir={elsewhere}"], cwd=tmp_path)
    assert typed.returncode == 0, typed.stdout + typed.stderr
    assert "this run already finished" in (elsewhere / "train.log").read_text()
    assert (run_dir / "train.log").read_text() == both


@pytest.mark.parametrize("content, why", [("", "not JSON: Expecting value"), ('{"accuracy": 0.9', "not JSON"),
                                          ("[0.9]", "JSON, but not an object with the run's objective"),
                                          ("{}", "JSON, but not an object with the run's objective")],
                         ids=["empty", "cut-short", "a-list", "no-objective"])
def test_a_results_file_that_is_not_a_runs_results_is_refused_by_name_and_touched_by_nothing(
        finished: Path, tmp_path: Path, content: str, why: str) -> None:
    """Whether the run finished, and with what, cannot be told from it: the run says so, changes nothing, and
    says how to go on (a run writes results.json whole, last, so something else changed it)."""
    run_dir = copy_of(finished, tmp_path)
    (run_dir / "results.json").write_text(content)
    before = files(run_dir)
    proc = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert f"error: {run_dir / 'results.json'} is not a run's results ({why}" in proc.stderr
    assert ("Nothing was changed. Restore it, or delete it: the same command then finishes the run again from its "
            "newest checkpoint (step 12): its final evaluation, export and results") in proc.stderr
    assert files(run_dir) == before


def test_a_finished_run_whose_results_were_deleted_finishes_again_with_the_same_results(finished: Path,
                                                                                       tmp_path: Path) -> None:
    """What the refusal above advises: results.json deleted, the same command writes it again from the newest
    checkpoint, training nothing."""
    run_dir = copy_of(finished, tmp_path)
    (run_dir / "results.json").unlink()
    output = train(run_dir, *FAST)
    assert "resuming from checkpoint" in output and "step 12 of 12" in output
    again, first = read_results(run_dir), read_results(finished)
    assert {key: again[key] for key in ("objective", "best_step", "train_steps", "identity")} == \
        {key: first[key] for key in ("objective", "best_step", "train_steps", "identity")}


def test_a_finished_run_trains_on_with_accepted_changes(finished: Path, tmp_path: Path) -> None:
    run_dir = copy_of(finished, tmp_path)
    refused = run_app([*FAST, "train.max_steps=18", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert refused.returncode == 1 and "train.accept_changes=[train.max_steps] continues it" in refused.stderr
    output = train(run_dir, *FAST, "train.max_steps=18", "train.accept_changes=[train.max_steps]")
    assert (f"{run_dir} holds a finished run at step 12; continuing it from there with new values "
            "(train.accept_changes): train.max_steps: 12 -> 18") in output
    assert "resuming from checkpoint" in output and read_results(run_dir)["train_steps"] == 18
    assert read_results(run_dir)["continued"] == [{"step": 12, "changes": {"train.max_steps": "12 -> 18"}}]
    # Its model card's command continued the run: started afresh with it, a run trains another model.
    card = (run_dir / "model" / "README.md").read_text()
    assert ("The run went on from a checkpoint with new values (train.accept_changes; results.json's `continued`): "
            "at step 12, train.max_steps: 12 -> 18. The command is its last attempt's") in card
    # The command that first made the folder is now the one with other settings; the advice names the folder's.
    original = run_app([*FAST, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert original.returncode == 1 and "train.max_steps: 18 -> 12\n" in original.stderr
    assert "To go on with that run, give the values it holds: train.max_steps=18;" in original.stderr
    again = train(run_dir, *FAST, "train.max_steps=18")  # the advice taken: the folder's run, the longer one
    assert "this run already finished" in again


@pytest.mark.parametrize("cadence", ["train.eval_every=6", "train.eval_every=3"])
def test_a_run_that_goes_on_evaluating_at_another_cadence_says_so(finished: Path, tmp_path: Path,
                                                                  cadence: str) -> None:
    """train.eval_every is outside the identity (it leaves the training as it is), but the best checkpoint, early
    stopping and pruning count its evaluations: a resume at another one is said in the log and results.json."""
    run_dir = copy_of(finished, tmp_path)
    output = train(run_dir, *FAST, cadence, "train.max_steps=18", "train.accept_changes=[train.max_steps]")
    said = ("this run evaluated every 6 steps up to step 12 and goes on evaluating every 3 (train.eval_every): a "
            "search's pruning and the choice of the best checkpoint count the evaluations of both")
    warnings = read_results(run_dir).get("warnings", [])
    if cadence.endswith("=6"):
        assert "goes on evaluating" not in output and not any("goes on evaluating" in each for each in warnings)
    else:
        assert said in output and any(each.startswith(said) for each in warnings)
        assert "To go on as it began, set train.eval_every=6" in output


def test_a_continued_run_whose_newest_manifest_is_damaged_keeps_its_record_and_its_results(
        finished: Path, tmp_path: Path) -> None:
    """The newest checkpoint's manifest cut short: the run's record was read from it alone, so the continuation was
    lost, the finished run was said to hold results 'before it went on', and it trained again from the checkpoint
    before, its results.json rewritten without `continued`. The record is the newest manifest that reads."""
    run_dir = copy_of(finished, tmp_path)
    accept = [*FAST, "train.max_steps=18", "train.accept_changes=[train.max_steps]"]
    train(run_dir, *accept)
    results = read_results(run_dir)
    manifest = run_dir / "checkpoints" / "step-000018" / "checkpoint.json"
    manifest.write_text(manifest.read_text()[:40])
    output = train(run_dir, *accept)
    assert "this run already finished" in output and "before it went on" not in output
    assert read_results(run_dir) == results


@pytest.mark.parametrize("keys", [["optimizer.lr"], ["train.max_steps", "seed"]])
def test_only_keys_where_continuing_makes_sense_can_be_accepted(keys: List[str]) -> None:
    from nli.errors import ConfigError

    with pytest.raises(ConfigError, match="a run cannot continue with new values of"):
        build_config([f"train.accept_changes=[{','.join(keys)}]"])
    assert "train.max_steps" in CONTINUABLE and "optimizer.lr" not in CONTINUABLE


@pytest.mark.parametrize("typed, meant", [("train.max_step", "train.max_steps"),
                                          ("train.early_stopping.patients", "train.early_stopping.patience")])
def test_a_misspelt_key_to_accept_is_named_with_the_one_meant(tmp_path: Path, typed: str, meant: str) -> None:
    """A typo was told 'a run cannot continue with new values of ['train.max_step']', as if it were a setting the
    run refuses to change, and to start a new run in another output_dir."""
    proc = run_app([*FAST, "train.max_steps=30", f"train.accept_changes=[{typed}]"], cwd=tmp_path)
    assert proc.returncode == 1 and not list(tmp_path.iterdir())
    assert proc.stderr == (f"error: train.accept_changes=['{typed}']: {typed} is no key: did you mean {meant}? A run "
                           f"continues with new values of {list(CONTINUABLE)}\n")


@pytest.fixture
def stalled(shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path) -> Path:
    """A finished run whose best is its first evaluation, step 3, with results.json removed: as if it had
    been stopped after its last checkpoint, before the end (a copy of this test's own)."""
    run_dir = copy_run(shared_run("still", STILL), tmp_path / "stalled")
    assert read_results(run_dir)["best_step"] == 3
    (run_dir / "results.json").unlink()
    return run_dir


def damage_best(run_dir: Path) -> None:
    state = run_dir / "checkpoints" / "step-000003" / "state.pt"
    data = bytearray(state.read_bytes())
    data[1000:1002] = b"xx"
    state.write_bytes(bytes(data))


def test_a_damaged_best_checkpoint_is_found_at_resume_and_its_export_keeps_its_weights(stalled: Path) -> None:
    run_dir = stalled
    exported = (run_dir / "model" / "model.safetensors").read_bytes()
    assert json.loads((run_dir / "model" / "export.json").read_text())["step"] == 3
    damage_best(run_dir)
    output = train(run_dir, *STILL)
    warning = output.index(f"the best checkpoint, {run_dir / 'checkpoints' / 'step-000003'}, is damaged: state.pt is "
                           "corrupt")
    assert warning < output.index("resuming from checkpoint")  # verified at resume, not at the end
    assert "Its weights are safe in" in output
    assert read_results(run_dir)["best_step"] == 3
    assert (run_dir / "model" / "model.safetensors").read_bytes() == exported


def test_with_the_best_checkpoint_and_its_export_lost_the_best_intact_one_is_exported(stalled: Path) -> None:
    run_dir = stalled
    damage_best(run_dir)
    shutil.rmtree(run_dir / "model")
    output = train(run_dir, *STILL)
    assert "and its export is gone: its weights are lost. The best intact evaluated checkpoint, step 9" in output
    results = read_results(run_dir)
    assert results["best_step"] == 9 and results["status"] == "completed"
    assert json.loads((run_dir / "model" / "export.json").read_text())["step"] == 9


@pytest.mark.process
def test_a_second_run_into_a_folder_in_use_is_refused_and_the_first_is_untouched(tmp_path: Path) -> None:
    """A run in another process holds the folder (it would train for minutes); a second run, with other
    settings, is refused naming it, and changes nothing: the first, stopped, saved its own config, and its log has
    no line of the second (the refusal was appended to it, an ERROR amid the first run's steps)."""
    run_dir = tmp_path / "run"
    first_args = [*FAST, "train.max_steps=100000", "data.synthetic_train_size=4800"]
    first = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *first_args, f"hydra.run.dir={run_dir}"],
                             cwd=tmp_path, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             env=process_env())
    try:
        log = run_dir / "train.log"
        deadline = time.monotonic() + 180
        while not (log.exists() and "step 3: loss" in log.read_text()):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()
            time.sleep(0.05)
        second = run_app([*FAST, "optimizer.lr=5e-3", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert first.poll() is None  # still training: the refusal below is the claim's
    finally:
        first.send_signal(signal.SIGTERM)
    assert second.returncode == 1 and "Traceback" not in second.stderr
    assert re.search(rf"{run_dir} is in use by another run: host \S+, pid {first.pid}, started ", second.stderr)
    assert first.wait(timeout=120) == 75, first.communicate()  # stopped by the signal, with a checkpoint
    assert not (run_dir / ".claim.json").exists()  # released as it stopped
    assert "in use by another run" not in (run_dir / "train.log").read_text()  # the log is the first run's alone
    saved = yaml.safe_load((run_dir / "config.yaml").read_text())
    assert saved["optimizer"]["lr"] == 1e-3 and saved["train"]["max_steps"] == 100000  # the first run's own


# Holds the default run folders (outputs/synthetic/<time>) of the next minute, as a run started in the same second
# as the command under test holds the one Hydra names for both; until its standard input closes.
HOLD_DEFAULT_FOLDERS = """
import contextlib, sys
from datetime import datetime, timedelta
from nli.io.claim import Claim
from nli.io.storage import Storage
with contextlib.ExitStack() as held:
    start = datetime.now()
    for second in range(60):
        name = (start + timedelta(seconds=second)).strftime("%Y-%m-%d_%H-%M-%S")
        held.enter_context(Claim.take(Storage(f"outputs/synthetic/{name}")))
    print("held", flush=True)
    sys.stdin.read()
"""


def test_a_default_folder_a_run_of_the_same_second_holds_is_refused_saying_why(tmp_path: Path) -> None:
    """Two commands started in the same second (a shell loop's &, two terminals), neither naming a folder, get the
    one Hydra names to the second: the later one was told that folder was in use by another run, and to wait for
    it, as if it had been pointed at a folder in use. It now says why, and the way out."""
    holder = subprocess.Popen([sys.executable, "-c", HOLD_DEFAULT_FOLDERS], cwd=tmp_path, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=process_env())
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n", holder.communicate()
        default = run_app([*FAST, "train.max_steps=2"], cwd=tmp_path)
        held = next((tmp_path / "outputs" / "synthetic").iterdir())
        named = run_app([*FAST, "train.max_steps=2", f"hydra.run.dir={held}"], cwd=tmp_path)
    finally:
        holder.communicate()
    assert default.returncode == 1 and "Traceback" not in default.stderr, default.stderr
    assert re.search(rf"error: {tmp_path}/outputs/synthetic/(\S+) is in use by another run: host \S+, "
                     rf"pid {holder.pid}, started .*\.claim\.json\. This command named no folder, and Hydra's default, "
                     r"outputs/synthetic/\1, is named to the second: commands started in the same second share it\. "
                     r"Give each its own hydra.run.dir \(or output_dir\)\n", default.stderr), default.stderr
    assert named.returncode == 1 and "in use by another run" in named.stderr  # a folder typed: refused as before
    assert "This command named no folder" not in named.stderr


@pytest.mark.process
def test_a_finished_run_going_on_with_new_values_is_not_said_done_until_it_ends_again(finished: Path,
                                                                                    tmp_path: Path) -> None:
    """Its earlier end's results.json stayed while it trained on, and after it was stopped: a file whose presence
    says the run is done, of 12 steps, beside the config.yaml of 60 and the model/ of the new steps' best, which
    python -m nli.report read as the run completed. The same command then ends it, with results of its own."""
    run_dir = copy_of(finished, tmp_path)
    going_on = [*FAST, "train.max_steps=60", "train.accept_changes=[train.max_steps]", f"hydra.run.dir={run_dir}"]
    proc = subprocess.Popen([sys.executable, str(ROOT / "train.py"), *going_on], cwd=tmp_path, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=process_env())
    try:
        log, deadline = run_dir / "train.log", time.monotonic() + 180
        while "step 15: loss" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 75, proc.communicate()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["train"]["max_steps"] == 60
    assert not (run_dir / "results.json").exists()  # stopped at step 15 or so of 60: not done
    train(run_dir, *going_on[:-1])
    results = read_results(run_dir)
    assert results["train_steps"] == 60 and results["continued"] == [
        {"step": 12, "changes": {"train.max_steps": "12 -> 60"}}]


def test_outputs_are_written_with_the_users_umask(tmp_path: Path) -> None:
    """A group that shares a cluster reads each other's results: model/ and its files as umask 002 gives."""
    finished = tmp_path / "run"
    before = os.umask(0o002)  # the run's process has it
    try:
        train(finished, *FAST)
    finally:
        os.umask(before)
    last = finished / "checkpoints" / "step-000012"
    modes = {path.relative_to(finished).as_posix(): stat.S_IMODE(path.stat().st_mode)
             for path in [finished / "model", *(finished / "model").iterdir(), finished / "results.json", last,
                          last / "state.pt"]}
    assert modes == {name: 0o775 if (finished / name).is_dir() else 0o664 for name in modes}


def test_a_run_from_before_a_key_existed_resumes_where_the_key_keeps_its_old_behaviour() -> None:
    from nli.config.identity import ADDED, differences, identity

    new = identity(OmegaConf.to_container(compose_config(["experiment=quickstart"]), resolve=True))
    old = {key: value for key, value in new.items() if key not in ADDED}  # written before those keys existed
    assert set(ADDED) <= set(new)
    # Each key was added at the value that computes as before, but for the synthetic task's version, whose default
    # has moved on (version 2): a run from before the key ran version 1, and says so.
    assert differences(old, new) == {"data.synthetic_version": "1 -> 2"}
    changed = {**new, "optimizer.layer_decay": 0.8, "data.synthetic_version": 1}
    assert differences(old, changed) == {"optimizer.layer_decay": "null -> 0.8"}  # the value the old run had


def measured_apart(results: Dict[str, object]) -> Dict[str, object]:
    return {key: value for key, value in results.items() if key not in {*MEASURED, "continued"}}


def test_a_run_that_early_stopping_ended_goes_on_under_a_larger_patience_as_a_run_started_with_it(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path) -> None:
    """The metric cannot move: patience 1 stops at step 6, the second evaluation; continued with patience 2
    (accepted), the run trains on from its checkpoint of step 6, with the evaluations it had, and stops at
    step 9, as a run started with patience 2 does: the same results, weights and metrics.csv."""
    started = shared_run("still-patience-2", [*STILL, "train.early_stopping.patience=2"])
    run_dir = tmp_path / "run"
    train(run_dir, *STILL, "train.early_stopping.patience=1")
    assert read_results(run_dir)["stopped_early"] == 6
    output = train(run_dir, *STILL, "train.early_stopping.patience=2",
                   "train.accept_changes=[train.early_stopping.patience]")
    assert (f"{run_dir} holds a finished run at step 6; continuing it from there with new values "
            "(train.accept_changes): train.early_stopping.patience: 1 -> 2") in output
    assert "step 9: stopping early" in output
    results, theirs = read_results(run_dir), read_results(started)
    assert results["stopped_early"] == results["train_steps"] == 9
    assert measured_apart(results) == measured_apart(theirs)  # the identity too: this run's settings are theirs
    assert results["continued"] == [{"step": 6, "changes": {"train.early_stopping.patience": "1 -> 2"}}]
    weights = [(folder / "model" / "model.safetensors").read_bytes() for folder in (run_dir, started)]
    assert weights[0] == weights[1]
    measured = ("train/examples_per_second", "train/tokens_per_second")
    rows = [[line.split(",")[:3] for line in (folder / "metrics.csv").read_text().splitlines()
             if line.split(",")[1] not in measured] for folder in (run_dir, started)]  # not when they were logged
    assert rows[0] == rows[1]
    assert "this run already finished" in train(run_dir, *STILL, "train.early_stopping.patience=2")


@pytest.mark.parametrize("change,removed,message", [
    # The metric never moves: patience 1 would have stopped the finished run at step 6, of 12.
    (["train.early_stopping.patience=1", "train.accept_changes=[train.early_stopping.patience]"], None,
     "early stopping would have ended it at step 6: a run cannot go back"),
    (["train.max_steps=8", "train.accept_changes=[train.max_steps]"], None,
     "train.max_steps=8 plans 8 steps, and the run already trained 12: it cannot be shortened"),
    (["train.skip_nonfinite=3", "train.accept_changes=[train.skip_nonfinite]"], None,
     "it would train no further and write nothing new: it has trained all the 12 steps"),
    (["train.max_steps=18", "train.accept_changes=[train.max_steps]"], "checkpoints",
     "holds a finished run but no checkpoint to continue it from"),
])
def test_new_values_that_a_finished_run_cannot_carry_out_are_refused_with_the_reason(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path, change: List[str], removed: str,
        message: str) -> None:
    run_dir = copy_of(shared_run("still", STILL), tmp_path)
    if removed:
        shutil.rmtree(run_dir / removed)
    before = files(run_dir)
    proc = run_app([*STILL, *change, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert message in proc.stderr and "Nothing was changed" in proc.stderr
    assert "continuing it" not in proc.stdout and files(run_dir) == before


@pytest.mark.parametrize("epochs,message", [
    ("0.5", "train.epochs=0.5 plans 10 steps, and the run already trained 12: it cannot be shortened"),
    ("0.6", "it would train no further and write nothing new: it has trained all the 12 steps train.epochs=0.6"),
])
def test_new_epochs_inside_the_first_epoch_are_checked_before_anything_loads(
        shared_run: Callable[[str, Sequence[str]], Path], tmp_path: Path, epochs: str, message: str) -> None:
    """Twelve steps of a 20-step epoch: the checkpoint keeps the epoch's size, so a new train.epochs is judged as
    the command starts, as a new train.max_steps is, and the refusal changes nothing in the folder (its config.yaml
    and overrides.yaml were rewritten, and the data loaded, before the loop refused it)."""
    long_epoch = [*FAST, "data.synthetic_train_size=640"]
    run_dir = copy_of(shared_run("fast-long-epoch", long_epoch), tmp_path)
    before = files(run_dir)
    proc = run_app([*long_epoch, "train.max_steps=null", f"train.epochs={epochs}",
                    "train.accept_changes=[train.max_steps,train.epochs]", f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert message in proc.stderr and "Nothing was changed" in proc.stderr
    assert "continuing it" not in proc.stdout and files(run_dir) == before


def test_a_finished_run_given_extra_sets_scores_them_and_trains_no_further(finished: Path, tmp_path: Path) -> None:
    from tests.support.nli_layouts import write_sets

    run_dir = copy_of(finished, tmp_path)
    sets = write_sets(tmp_path / "sets")
    earlier = read_results(run_dir)
    output = train(run_dir, *FAST, "eval.extra=[hans]", f"eval.dir={sets}",
                   "train.accept_changes=[eval.extra,eval.dir]")
    assert "continuing it from there with new values" in output and not re.search(r"step \d+: loss", output)
    results = read_results(run_dir)
    assert "hans/accuracy" in results and results["train_steps"] == 12 and results["best_step"] == earlier["best_step"]
    assert results["accuracy"] == earlier["accuracy"]
    assert [each["step"] for each in results["continued"]] == [12]
    # Stopped in its final phase after the sets' scores were logged (at step 12, its last checkpoint's), then run
    # again: it resumes at step 12 and logs them once more, in place of the stopped attempt's rows.
    logged = (run_dir / "metrics.csv").read_text()
    assert logged.count("12,eval/hans/accuracy,") == 1
    (run_dir / "results.json").unlink()
    train(run_dir, *FAST, "eval.extra=[hans]", f"eval.dir={sets}", "train.accept_changes=[eval.extra,eval.dir]")
    rows = [",".join(line.split(",")[:3]) for line in (run_dir / "metrics.csv").read_text().splitlines()]
    assert rows == [",".join(line.split(",")[:3]) for line in logged.splitlines()]


def test_a_continuation_that_fails_as_it_loads_leaves_the_folders_record_as_it_was(finished: Path,
                                                                                   tmp_path: Path) -> None:
    """Accepted, then stopped by a set it cannot read: config.yaml and overrides.yaml still record the run the
    folder holds (they named the new eval.extra and the failed command), and the same command, mended, goes on."""
    from tests.support.nli_layouts import write_sets

    run_dir = copy_of(finished, tmp_path)
    sets = write_sets(tmp_path / "sets")
    hans = sets / "hans" / "heuristics_evaluation_set.txt"
    good = hans.read_bytes()
    hans.write_text("nothing\tuseful\n")
    before = files(run_dir)
    extra = [*FAST, "eval.extra=[hans]", f"eval.dir={sets}", "train.accept_changes=[eval.extra,eval.dir]"]
    proc = run_app([*extra, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and f"error: {hans}: no column 'sentence1'" in proc.stderr, proc.stdout + proc.stderr
    assert files(run_dir) == before
    hans.write_bytes(good)
    train(run_dir, *extra)
    assert yaml.safe_load((run_dir / "overrides.yaml").read_text()) == extra
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["eval"]["extra"] == ["hans"]


def test_the_folders_values_are_offered_only_where_they_can_be_typed() -> None:
    """A value the command line cannot take as it is (a mapping, a string with a space) is not offered as an
    override: the advice points at the overrides the folder's last command recorded instead."""
    typed = refuse("out", "a finished run", {"optimizer.lr": "0.001 -> 0.002", "train.predict": "false -> true"},
                   {"optimizer.lr": 0.001, "train.predict": False}, checkpointed=True)
    assert "give the values it holds: optimizer.lr=0.001 train.predict=false;" in str(typed)
    untypable = refuse("out", "a finished run", {"data.files": "{...} -> {...}"}, {"data.files": {"train": "a b.csv"}},
                       checkpointed=True)
    assert "run the command it last ran with again (its overrides.yaml lists that command's overrides)" in \
        str(untypable)


def test_lora_against_full_fine_tuning_is_one_change_and_the_advice_composes() -> None:
    """A LoRA run's folder asked again without model/peft=lora listed each adapter key as '8 -> (none)' and advised
    typing them (model.peft.alpha=8 ..., which the config refuses: no model.peft to set them in); the other way
    round it listed 'model.peft: null -> null'. Now one change, of model.peft, and advice that composes."""
    def ident(*extra: str) -> Dict[str, object]:
        resolved = OmegaConf.to_container(compose_config(["experiment=quickstart", *extra]), resolve=True)
        assert isinstance(resolved, dict)
        return identity(resolved)

    lora, full = ident("model/peft=lora"), ident()
    assert list(differences(lora, full)) == list(differences(full, lora)) == ["model.peft"]
    assert differences(full, lora)["model.peft"].startswith("null -> {")
    to_lora = str(refuse("out", "a finished run", differences(lora, full), lora, checkpointed=True))
    assert "run the command it last ran with again (its overrides.yaml lists" in to_lora
    to_full = str(refuse("out", "a finished run", differences(full, lora), full, checkpointed=True))
    assert "give the values it holds: model.peft=null;" in to_full
    assert ident("model/peft=lora", "model.peft=null") == full  # the advice, typed after the LoRA command's


def test_an_mnli_run_from_before_the_diagnostic_set_has_the_identity_it_had() -> None:
    """task.diagnostic says which unlabelled set an MNLI run predicts for GLUE (AX.tsv): nothing it trains. Out
    of the identity, MNLI folders written before it continue, and their results.json's digest stands."""
    from nli.config.identity import digest, identity

    resolved = OmegaConf.to_container(compose_config(["task=mnli"]), resolve=True)
    assert isinstance(resolved, dict) and resolved["task"]["diagnostic"]["submission"] == "AX"
    before = {**resolved, "task": {k: v for k, v in resolved["task"].items() if k != "diagnostic"}}
    assert identity(resolved) == identity(before) and digest(identity(resolved)) == digest(identity(before))


def test_a_continuation_keeps_only_the_predictions_its_own_model_made(tmp_path: Path) -> None:
    """Continued with train.predict off and an eval.extra set dropped, the earlier attempt's test predictions and
    that set's eval predictions described the step-2 model: they stayed, the run's file list named them and the
    report tools read them as the continued model's. The final phase removes what it did not write (the dropped set's
    folder too: it stayed, empty), keeps what it wrote, and a repeat of that phase (results.json lost) ends the
    same."""
    from tests.support.nli_layouts import write_sets
    from tests.support.runs import GLUE_DATA

    run_dir, sets = tmp_path / "run", write_sets(tmp_path / "sets")
    rte = ["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64", "train.batch_size=16",
           "train.eval_every=2", "train.progress_bar=false", "hw=cpu"]
    train(run_dir, *rte, "train.max_steps=2", "train.predict=true", "eval.extra=[hans]", f"eval.dir={sets}")
    assert (run_dir / "predictions" / "RTE.tsv").is_file() and (run_dir / "eval_predictions" / "hans").is_dir()
    went_on = [*rte, "train.max_steps=4", "train.predict=false", "eval.extra=[]",
               "train.accept_changes=[train.max_steps,train.predict,eval.extra,eval.dir]"]
    output = train(run_dir, *went_on)
    kept = sorted(str(p.relative_to(run_dir)) for p in (run_dir / "eval_predictions").rglob("*") if p.is_file())
    assert not (run_dir / "predictions").exists() and not re.search(r"^\s+predictions\s", output, re.M)
    assert kept == ["eval_predictions/validation.jsonl"]
    assert not (run_dir / "eval_predictions" / "hans").exists()  # the dropped set's folder too, not left empty
    assert read_results(run_dir)["train_steps"] == 4
    written = files(run_dir)
    (run_dir / "results.json").unlink()  # as if stopped in its final phase: the same command ends it again
    train(run_dir, *went_on)
    assert {name for name in files(run_dir) if "predictions" in name} == \
        {name for name in written if "predictions" in name}
    # Continued with eval.save_predictions=false: the folder holds no eval predictions of an earlier model.
    train(run_dir, *went_on[:-1], "train.max_steps=6", "eval.save_predictions=false",
          "train.accept_changes=[train.max_steps]")
    assert not (run_dir / "eval_predictions").exists() and read_results(run_dir)["train_steps"] == 6
