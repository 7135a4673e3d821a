"""Runs that survive preemption: the real train.py stopped by SIGTERM or SIGKILL (in a process of its
own), started again with the same command (in this process), must end exactly where an uninterrupted
run ends, on local disk and on Cloud Storage (a local emulator); damaged checkpoints, another run's
checkpoints, a full disk and an unwritable output directory must each stop or fall back with a clear
message."""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import resource
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence, Tuple

import pytest
import torch
from safetensors.torch import load

from nli.io.claim import Claim
from nli.io.storage import Storage
from nli.runtime import provenance
from nli.train.checkpoint import CHECKPOINTS_CLAIM, Checkpoints
from tests.support.runs import FAST, MEASURED, ROOT, copy_run, process_env, read_results, run_app, shared_folder
from tests.support.wandb_records import records

# 20 optimizer steps per epoch, 50 in all: the signal lands in the middle of the second epoch.
ARGS = ["experiment=quickstart", "data.synthetic_train_size=640", "data.synthetic_eval_size=96", "hw=cpu",
        "train.max_steps=50", "train.eval_every=15", "train.log_every=1", "train.checkpoint_every=5",
        "train.progress_bar=false"]


def start(args: List[str], cwd: Path, env: Dict[str, str] | None = None,
          preexec_fn: Callable[[], None] | None = None) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, preexec_fn=preexec_fn,
                            env=process_env(env))


def wait_for_step(proc: subprocess.Popen, log: Path, step: int, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while f"step {step}: loss" not in (log.read_text() if log.exists() else ""):
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"no step {step} in {log}"
        time.sleep(0.05)


def stop_with_sigterm(run_dir: Path, *, after_step: int = 23, env: Dict[str, str] | None = None,
                      args: List[str] = ARGS) -> subprocess.CompletedProcess:
    proc = start([*args, f"hydra.run.dir={run_dir}"], run_dir.parent, env)
    wait_for_step(proc, run_dir / "train.log", after_step)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def weights(data: bytes) -> Dict[str, torch.Tensor]:
    return load(data)


Outcome = Tuple[Dict, Dict[str, torch.Tensor]]  # results.json, and the exported model's weights


def assert_same_run(ours: Outcome, theirs: Outcome) -> None:
    (our_results, our_weights), (their_results, their_weights) = ours, theirs
    assert {k: v for k, v in our_results.items() if k not in MEASURED} == \
        {k: v for k, v in their_results.items() if k not in MEASURED}
    assert our_weights.keys() == their_weights.keys()
    for key, tensor in their_weights.items():
        assert torch.equal(our_weights[key], tensor), key  # exactly, on the CPU


def local_outcome(run_dir: Path) -> Outcome:
    return read_results(run_dir), weights((run_dir / "model" / "model.safetensors").read_bytes())


def checkpoints(run_dir: Path) -> Dict[str, bool]:
    """Checkpoint folder -> whether it is complete (has its manifest)."""
    return {p.name: (p / "checkpoint.json").exists() for p in sorted((run_dir / "checkpoints").iterdir())}


def intact(folder: Path) -> bool:
    manifest = json.loads((folder / "checkpoint.json").read_text())
    return all(hashlib.sha256((folder / name).read_bytes()).hexdigest() == entry["sha256"]
               for name, entry in manifest["files"].items())


def snapshot(run_dir: Path) -> Dict[str, bytes]:
    return {str(p.relative_to(run_dir)): p.read_bytes() for p in sorted(run_dir.rglob("*"))
            if p.is_file() and p.name != "train.log" and ".hydra" not in p.parts}


@pytest.fixture
def uninterrupted(shared_run: Callable[[str, Sequence[str]], Path]) -> Outcome:
    return local_outcome(shared_run("resume-uninterrupted", ARGS))


def preempt(run_dir: Path) -> None:
    """A run stopped by SIGTERM in the middle of its second epoch."""
    proc = stop_with_sigterm(run_dir)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    stopped_at = int(re.search(r"preempted, resumable: SIGTERM at step (\d+)", proc.stderr).group(1))
    assert checkpoints(run_dir)[f"step-{stopped_at:06d}"]  # the step it stopped at is saved, whole


@pytest.fixture
def preempted(shared_root: Path) -> Path:
    """A run stopped by SIGTERM in the middle of its second epoch (once per session); tests resume copies of it."""
    return shared_folder(shared_root, "resume-preempted", [*ARGS, "SIGTERM after step 23"], preempt)


def copy_of(preempted: Path, tmp_path: Path) -> Path:
    return copy_run(preempted, tmp_path / "run")


def resume(run_dir: Path, *extra: str, **kwargs: object) -> subprocess.CompletedProcess:
    return run_app([*ARGS, *extra, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent, **kwargs)


@pytest.mark.process
def test_sigterm_mid_epoch_then_resume_ends_as_if_never_stopped(preempted: Path, tmp_path: Path,
                                                                uninterrupted: Outcome) -> None:
    run_dir = copy_of(preempted, tmp_path)
    newest = max(name for name, complete in checkpoints(run_dir).items() if complete)
    state = torch.load(run_dir / "checkpoints" / newest / "state.pt", weights_only=True)
    progress = state["parts"]["progress"]
    assert 0 < progress["examples_in_epoch"] < 640 and progress["epoch"] == 1, (newest, progress)  # mid-epoch
    proc = resume(run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / newest}: step {int(newest[5:])} of 50" in proc.stdout
    assert_same_run(local_outcome(run_dir), uninterrupted)
    assert "code_history" not in read_results(run_dir)["provenance"]  # one code throughout: nothing to tell apart
    # Started once more, the finished run reports its results and trains no further.
    results = (run_dir / "results.json").read_bytes()
    again = resume(run_dir)
    assert again.returncode == 0 and "this run already finished" in again.stdout and "training:" not in again.stdout
    assert (run_dir / "results.json").read_bytes() == results


@pytest.mark.process
def test_a_run_that_goes_on_under_other_code_says_so_and_records_which_steps_ran_under_which(
        preempted: Path, tmp_path: Path) -> None:
    """The steps before the newest checkpoint ran an older commit with another torch, as a run requeued after a
    git pull and an upgrade would have: its checkpoint's record of the code says so. Resumed, the run warns,
    and results.json and the model card say that its steps ran under more than one version of the code."""
    run_dir = copy_of(preempted, tmp_path)
    newest = max(name for name, complete in checkpoints(run_dir).items() if complete)
    manifest_file = run_dir / "checkpoints" / newest / "checkpoint.json"
    manifest = json.loads(manifest_file.read_text())
    (first,) = manifest["code"]
    assert first["step"] == 0 and first["code"] == provenance.code_of({**provenance.changed_code(),
                                                                          "versions": provenance.versions()})
    older = {**first["code"], "commit": "0" * 40, "versions": {**first["code"]["versions"], "torch": "2.0.0"}}
    manifest["code"] = [{"step": 0, "code": older}]
    manifest_file.write_text(json.dumps(manifest))

    proc = resume(run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results, step = read_results(run_dir), int(newest[5:])
    now = provenance.code_of(results["provenance"])
    assert results["provenance"]["code_history"] == [{"step": 0, "code": older}, {"step": step, "code": now}]
    said = (f"this run goes on from step {step} under other code than its steps before it (commit {'0' * 40} -> "
            f"{now['commit']}; torch 2.0.0 -> {now['versions']['torch']}): its figures come from both, and "
            "results.json's provenance.code_history says which steps ran under which. To train under one, start it "
            "afresh in another output_dir")
    assert results["warnings"] == [said] and f"[WARNING] - {said}\n" in proc.stdout
    assert "Its steps ran under more than one version of the code" in (run_dir / "model" / "README.md").read_text()
    last = max(name for name, complete in checkpoints(run_dir).items() if complete)
    assert json.loads((run_dir / "checkpoints" / last / "checkpoint.json").read_text())["code"] == \
        results["provenance"]["code_history"]  # a later attempt is told of both


@pytest.mark.process
def test_checkpoints_keep_the_newest_and_the_best(preempted: Path) -> None:
    complete = [name for name, done in checkpoints(preempted).items() if done]
    manifests = {n: json.loads((preempted / "checkpoints" / n / "checkpoint.json").read_text()) for n in complete}
    evaluated = {n: m["objective"] for n, m in manifests.items() if m["objective"] is not None}
    assert "step-000015" in evaluated  # the only evaluation before the signal, so the best
    assert len(complete) == 3 and all(intact(preempted / "checkpoints" / n) for n in complete)


@pytest.mark.process
def test_sigkill_while_a_checkpoint_is_written(tmp_path: Path, uninterrupted: Outcome) -> None:
    """Checkpoint every step, and kill the process while a checkpoint folder has no manifest yet."""
    run_dir = tmp_path / "run"
    args = [*ARGS, "train.checkpoint_every=1", f"hydra.run.dir={run_dir}"]
    for _attempt in range(10):
        proc = start(args, tmp_path)
        caught = None
        while proc.poll() is None and caught is None:
            found = checkpoints(run_dir) if (run_dir / "checkpoints").is_dir() else {}
            caught = next((n for n, done in found.items() if not done and n > "step-000005"), None)
        proc.kill()
        proc.communicate()
        if caught and not checkpoints(run_dir).get(caught, True):
            break  # killed with that checkpoint half-written
    else:
        pytest.fail("never caught a checkpoint being written")
    previous = max(n for n, done in checkpoints(run_dir).items() if done and n < caught)
    done = run_app(args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / previous}" in done.stdout
    assert_same_run(local_outcome(run_dir), uninterrupted)


@pytest.mark.process
@pytest.mark.parametrize("kills", [3, pytest.param(15, marks=pytest.mark.slow)])
def test_sigkill_at_random_moments_then_the_same_command_ends_as_if_never_stopped(tmp_path: Path, kills: int,
                                                                                 uninterrupted: Outcome) -> None:
    """Fault injection: a run that checkpoints every step, killed without warning at random moments (in
    start-up, mid-step, mid-save, during the final export), then the same command: it ends bit for bit
    where an uninterrupted run ends. The moments are drawn from a fixed seed, so a failure repeats."""
    rng = random.Random(kills)
    run_dir = tmp_path / "run"
    args = [*ARGS, "train.checkpoint_every=1", f"hydra.run.dir={run_dir}"]
    for _ in range(kills):
        proc = start(args, tmp_path)
        deadline = time.monotonic() + rng.uniform(2.0, 12.0)  # start-up alone takes seconds
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        proc.kill()
        proc.communicate()
    done = run_app(args, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_same_run(local_outcome(run_dir), uninterrupted)


def damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "corrupt":
        data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data if how == "corrupt" else data[: len(data) // 3]))


def test_a_corrupt_checkpoint_falls_back_to_the_one_before(preempted: Path, tmp_path: Path,
                                                           uninterrupted: Outcome) -> None:
    run_dir = copy_of(preempted, tmp_path)
    names = sorted(n for n, done in checkpoints(run_dir).items() if done)
    damage(run_dir / "checkpoints" / names[-1] / "state.pt", "corrupt")
    proc = resume(run_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"checkpoint {run_dir / 'checkpoints' / names[-1]} is damaged: state.pt is corrupt (its SHA-256 " \
           "does not match the manifest)" in proc.stdout
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / names[-2]}" in proc.stdout
    assert_same_run(local_outcome(run_dir), uninterrupted)


@pytest.mark.parametrize("how,message", [("truncated", "state.pt is truncated"), ("missing", "state.pt is missing")])
def test_which_file_is_damaged_is_named(preempted: Path, tmp_path: Path, how: str, message: str,
                                       caplog: pytest.LogCaptureFixture) -> None:
    """The checkpointer on its own, in this process: the run's resume path, without the run."""
    run_dir = copy_of(preempted, tmp_path)
    names = sorted(n for n, done in checkpoints(run_dir).items() if done)
    state = run_dir / "checkpoints" / names[-1] / "state.pt"
    if how == "missing":
        state.unlink()
    else:
        damage(state, how)
    saved = json.loads((run_dir / "checkpoints" / names[-1] / "checkpoint.json").read_text())["identity"]
    resumed = Checkpoints(Storage(str(run_dir / "checkpoints")), keep=2, identity=saved).latest()
    assert resumed is not None and resumed.name == names[-2] and resumed.state["progress"]["step"] == int(names[-2][5:])
    assert f"checkpoint {run_dir / 'checkpoints' / names[-1]} is damaged: {message}" in caplog.text
    assert "tokenizer.json" in resumed.tokenizer_files


def test_a_checkpoint_of_another_version_is_refused_and_left_alone(preempted: Path, tmp_path: Path) -> None:
    """A checkpoint written before the checkpoint registry (format 1: no format in its manifest) is not
    read as if it were one of today's: the run stops, says why, and changes nothing."""
    run_dir = copy_of(preempted, tmp_path)
    newest = run_dir / "checkpoints" / max(n for n, done in checkpoints(run_dir).items() if done)
    manifest = json.loads((newest / "checkpoint.json").read_text())
    del manifest["format"]
    (newest / "checkpoint.json").write_text(json.dumps(manifest))
    before = snapshot(run_dir)
    proc = resume(run_dir)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"{newest} was written by another version of this project (checkpoint format 1, this one reads 2)"
            in proc.stderr)
    assert snapshot(run_dir) == before


def test_every_checkpoint_damaged_is_a_clear_error(preempted: Path, tmp_path: Path) -> None:
    run_dir = copy_of(preempted, tmp_path)
    for folder in (run_dir / "checkpoints").iterdir():
        (folder / "state.pt").write_bytes(b"not a checkpoint")
    proc = resume(run_dir)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"no intact checkpoint in {run_dir / 'checkpoints'}: every one is damaged" in proc.stderr


@pytest.mark.parametrize("changed,listed", [
    (["model.scratch.hidden_size=64"], ["model.scratch.hidden_size: 128 -> 64"]),
    # A bigger global batch would make "step 23 of 25" of a run planned in steps of 32.
    (["train.batch_size=64", "optimizer.lr=2e-3"], ["optimizer.lr: 0.001 -> 0.002", "train.batch_size: 32 -> 64"]),
    (["seed=7"], ["seed: 42 -> 7"]),
])
def test_a_stopped_run_asked_again_with_other_settings_is_refused_and_left_alone(
        preempted: Path, tmp_path: Path, changed: List[str], listed: List[str]) -> None:
    run_dir = copy_of(preempted, tmp_path)
    before = snapshot(run_dir)
    proc = resume(run_dir, *changed)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    stopped_at = max(int(n[5:]) for n, done in checkpoints(run_dir).items() if done)
    assert f"{run_dir} holds a run stopped at step {stopped_at} with other settings:" in proc.stderr
    assert "\n".join(f"  {line}" for line in listed) in proc.stderr and "Nothing was changed" in proc.stderr
    assert snapshot(run_dir) == before


def test_what_cannot_change_the_result_may_change_on_resume(preempted: Path, tmp_path: Path,
                                                            uninterrupted: Outcome) -> None:
    """Logging, checkpoint frequency and the hardware are not the run's identity: changed, the run continues
    and ends where it would have."""
    run_dir = copy_of(preempted, tmp_path)
    proc = resume(run_dir, "train.log_every=2", "train.checkpoint_every=7", "train.keep_checkpoints=3",
                  "logger=csv")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_run(local_outcome(run_dir), uninterrupted)


@pytest.mark.parametrize("moved", [False, True], ids=["given-one-now", "stopped-with-one"])
def test_a_stopped_run_looked_for_in_another_checkpoint_dir_is_refused_not_started_afresh(
        preempted: Path, tmp_path: Path, moved: bool) -> None:
    """train.checkpoint_dir is outside the run's identity: given on resume where the run kept its checkpoints in its
    folder (or dropped where it kept them elsewhere), the run found none, trained again from step 0 and overwrote the
    folder's model and metrics, its stopped steps silently lost."""
    run_dir, elsewhere = copy_of(preempted, tmp_path), tmp_path / "elsewhere"
    stopped_at = max(int(n[5:]) for n, done in checkpoints(run_dir).items() if done)
    if moved:  # a run stopped with train.checkpoint_dir=elsewhere, as its config.yaml records it
        shutil.move(str(run_dir / "checkpoints"), str(elsewhere))
        config = run_dir / "config.yaml"
        config.write_text(config.read_text().replace("  checkpoint_dir: null\n", f"  checkpoint_dir: {elsewhere}\n"))
    before = snapshot(run_dir)
    proc = resume(run_dir, *([] if moved else [f"train.checkpoint_dir={elsewhere}"]))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    kept, looked = (elsewhere, run_dir / "checkpoints") if moved else (run_dir / "checkpoints", elsewhere)
    way = f"give train.checkpoint_dir={elsewhere}" if moved else "leave train.checkpoint_dir unset, as it was"
    assert (f"error: {run_dir} holds a run stopped at step {stopped_at}, its checkpoints in {kept}; this command keeps "
            f"checkpoints in {looked}, where there are none, and would train it again from step 0. Nothing was "
            f"changed. To continue it, {way}") in proc.stderr
    assert "training:" not in proc.stdout and snapshot(run_dir) == before


def test_another_runs_checkpoints_in_a_shared_checkpoint_dir_are_named_as_such(tmp_path: Path) -> None:
    """Two runs given one train.checkpoint_dir (a sweep's jobs): the second, in a new output folder, was refused as
    if that folder held "a run stopped at step 12 with other settings", with advice (its own output_dir, which it
    had) that could not help."""
    shared = tmp_path / "checkpoints"
    first = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_app([*FAST, "seed=7", f"train.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'two'}"],
                     cwd=tmp_path)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stdout + second.stderr
    assert (f"error: train.checkpoint_dir={shared} holds the checkpoints of another run (step 12; other settings: "
            f"seed), and {tmp_path / 'two'} no run of its own. Nothing was changed. Give each run a "
            "train.checkpoint_dir of its own") in second.stderr
    assert "training:" not in second.stdout and "holds a run stopped" not in second.stderr


def test_a_run_of_the_same_settings_is_refused_another_runs_checkpoints_in_a_shared_checkpoint_dir(
        tmp_path: Path) -> None:
    """Two runs of the same settings given one train.checkpoint_dir, each its own output folder: the second went on
    from the first's checkpoints as if they were its own, reporting the first's training as its own in its folder.
    Once the first run's folder is gone (lost, moved), its checkpoints are continued in the new one."""
    shared, one, two = tmp_path / "checkpoints", tmp_path / "one", tmp_path / "two"
    first = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={one}"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    second = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={two}"], cwd=tmp_path)
    assert second.returncode == 1 and "Traceback" not in second.stderr, second.stdout + second.stderr
    assert (f"error: train.checkpoint_dir={shared} holds the checkpoints of the run in {one} (step 12), not of this "
            f"run's output folder, {two}. Nothing was changed. To continue that run, give output_dir={one}; to start "
            "this one, give it a train.checkpoint_dir of its own") in second.stderr
    assert "resuming from checkpoint" not in second.stdout and not (two / "results.json").exists()
    shutil.rmtree(one)  # the first run's folder lost: its checkpoints are the run, continued in the new folder
    third = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={two}"], cwd=tmp_path)
    assert third.returncode == 0, third.stdout + third.stderr
    assert f"{shared} holds the checkpoints of the run in {one}, a folder that no longer holds it" in third.stdout
    assert f"resuming from checkpoint {shared / 'step-000012'}" in third.stdout and (two / "results.json").exists()


def test_a_second_run_at_once_in_a_checkpoint_dir_is_refused(tmp_path: Path) -> None:
    """Two runs started at once with one train.checkpoint_dir, each its own output folder: neither found the other's
    checkpoints, both trained, each overwriting the other's checkpoint of each step. The checkpoint folder is held by
    its run, as its output folder is (the first run's hold taken here, as a run takes it)."""
    shared = tmp_path / "checkpoints"
    with Claim.take(Storage(str(shared), key="train.checkpoint_dir"), use=CHECKPOINTS_CLAIM) as first:
        second = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'two'}"], cwd=tmp_path)
        assert second.returncode == 1 and "Traceback" not in second.stderr, second.stdout + second.stderr
        assert (f"error: {shared} is in use by another run: host {first.owner.host}, pid {first.owner.pid}, "
                "started ") in second.stderr
        assert "give this run another train.checkpoint_dir" in second.stderr and "training:" not in second.stdout
        assert sorted(path.name for path in shared.iterdir()) == [".checkpoints_claim.json"]
    again = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'two'}"], cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr  # the first run ended: its hold with it
    assert not (shared / ".checkpoints_claim.json").exists()


def test_resume_false_refuses_and_says_how_to_start_afresh(preempted: Path, tmp_path: Path) -> None:
    run_dir = copy_of(preempted, tmp_path)
    before = snapshot(run_dir)
    proc = resume(run_dir, "train.resume=false")
    assert proc.returncode == 1
    assert "train.resume=false refuses to continue or overwrite it. Choose another output_dir" in proc.stderr
    assert snapshot(run_dir) == before


def test_resume_false_over_a_checkpoint_dir_says_to_choose_another_checkpoint_dir(tmp_path: Path) -> None:
    """train.resume=false over the checkpoints of a train.checkpoint_dir said to choose another output_dir, which
    changes nothing there: the same refusal again in the new folder."""
    shared = tmp_path / "checkpoints"
    first = run_app([*FAST, f"train.checkpoint_dir={shared}", f"hydra.run.dir={tmp_path / 'one'}"], cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    again = run_app([*FAST, f"train.checkpoint_dir={shared}", "train.resume=false",
                     f"hydra.run.dir={tmp_path / 'two'}"], cwd=tmp_path)
    assert again.returncode == 1 and "Traceback" not in again.stderr, again.stdout + again.stderr
    assert (f"error: {shared} holds a checkpoint of step 12 and train.resume=false refuses to continue or overwrite "
            "it. Choose another train.checkpoint_dir (or leave it unset) to start afresh") in again.stderr


@pytest.mark.process
def test_a_full_disk_during_a_checkpoint_keeps_the_earlier_ones(preempted: Path, tmp_path: Path,
                                                                uninterrupted: Outcome) -> None:
    """A file-size limit makes the next checkpoint's write fail as a full disk would."""
    run_dir = copy_of(preempted, tmp_path)
    earlier = {n for n, done in checkpoints(run_dir).items() if done}

    def small_files() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write with EFBIG instead of dying
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))

    proc = start([*ARGS, f"hydra.run.dir={run_dir}"], tmp_path, preexec_fn=small_files)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 1 and "Traceback" not in err, out + err
    assert "could not write" in err and "state.pt: [Errno 27] File too large" in err
    assert {n for n, done in checkpoints(run_dir).items() if done} == earlier
    assert all(intact(run_dir / "checkpoints" / n) for n in earlier)
    proc = resume(run_dir)  # space again: it goes on from the newest intact checkpoint
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert_same_run(local_outcome(run_dir), uninterrupted)


def test_a_non_finite_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path: Path) -> None:
    diverge = [*ARGS, "optimizer.lr=1e4", "train.max_grad_norm=null", "schedule.warmup_ratio=0",
               "train.checkpoint_every=2"]
    run_dir = tmp_path / "run"
    proc = run_app([*diverge, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: the training loss is nan at step 4: stopped, and the last good checkpoint, step 2, is kept" \
        in proc.stderr
    assert checkpoints(run_dir) == {"step-000002": True}
    skipping = tmp_path / "skipping"
    proc = run_app([*diverge, "train.skip_nonfinite=100", f"hydra.run.dir={skipping}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "step 4: the loss is nan; skipping this update (1 of train.skip_nonfinite=100)" in proc.stdout
    skips = proc.stdout.count(": the loss is nan; skipping this update")
    assert skips > 1 and read_results(skipping)["train_skipped_steps"] == skips
    assert f"; {skips} of them skipped, their loss or gradients not finite (every figure in" in proc.stdout
    # Its weights diverged before the loss did: what it ends with says so, rather than calling its NaN's argmax a
    # model that predicts one class, or fitting a temperature to NaN.
    results = read_results(skipping)
    assert math.isnan(results["loss"]) and results["warnings"] == [
        "validation: the model's outputs are NaN or infinite for 96 of 96 examples, so its predictions there, and "
        "the figures that count them, mean nothing: the model diverged. Lower optimizer.lr, clip gradients "
        "(train.max_grad_norm), or compute in bf16 or fp32 where fp16 overflows"]
    assert "temperature" not in results["calibration"]["validation"] and "temperature" not in proc.stdout


def test_an_unwritable_output_dir_fails_before_training(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    proc = run_app([*ARGS, f"output_dir={blocker}/run", f"hydra.run.dir={tmp_path}/hydra"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip() == (f"error: output_dir={blocker}/run: {blocker} is a file, not a folder. Set "
                                   "output_dir to a folder")
    assert "training:" not in proc.stdout


@pytest.mark.process
def test_on_cloud_storage_sigterm_then_resume_ends_as_if_never_stopped(tmp_path: Path, gcs_emulator: Dict[str, str],
                                                                      uninterrupted: Outcome) -> None:
    import gcsfs

    url = "gs://test-bucket/runs/preempted"
    args = [*ARGS, f"output_dir={url}", "logger=[csv,tensorboard,wandb]", "logger.wandb.mode=offline"]
    proc = stop_with_sigterm(tmp_path / "hydra", env=gcs_emulator, args=args)
    assert proc.returncode == 75, proc.stdout + proc.stderr
    fs = gcsfs.GCSFileSystem()
    # The loggers' files, written on local disk, are in the bucket as they were at the stop's checkpoint.
    stopped_at = int(re.search(r"SIGTERM at step (\d+)", proc.stderr)[1])
    assert tensorboard_steps(fs, "test-bucket/runs/preempted/tensorboard", tmp_path / "tb-stopped") == \
        list(range(1, stopped_at + 1))
    assert f"\n{stopped_at},train/loss," in fs.cat_file("test-bucket/runs/preempted/metrics.csv").decode()
    assert fs.glob("test-bucket/runs/preempted/wandb/offline-run-*/run-*.wandb")  # W&B's offline run, too
    names = [p.rsplit("/", 1)[-1] for p in fs.ls("test-bucket/runs/preempted/checkpoints")]
    newest = max(n for n in names if fs.exists(f"test-bucket/runs/preempted/checkpoints/{n}/checkpoint.json"))
    proc = run_app([*args, f"hydra.run.dir={tmp_path}/hydra-again"], cwd=tmp_path, env=gcs_emulator)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"resuming from checkpoint {url}/checkpoints/{newest}" in proc.stdout
    results = json.loads(fs.cat_file("test-bucket/runs/preempted/results.json"))
    assert_same_run((results, weights(fs.cat_file("test-bucket/runs/preempted/model/model.safetensors"))),
                    uninterrupted)
    assert fs.exists("test-bucket/runs/preempted/model/tokenizer.json")
    events = tensorboard_events(fs, "test-bucket/runs/preempted/tensorboard", tmp_path / "tb-done")
    assert [event.step for event in events.Scalars("train/loss")] == list(range(1, 51))
    assert [event.value for event in events.Scalars("objective")] == [pytest.approx(results["objective"])]
    assert "task:\n  name: synthetic" in events.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    logged = hparams_of(events)
    assert logged["optimizer.lr"] == 1e-3 and logged["task.name"] == "synthetic" and logged["train.max_steps"] == 50


def tensorboard_events(fs: Any, folder: str, local: Path) -> Any:
    """The event files of a bucket folder, downloaded and read as TensorBoard reads them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    fs.invalidate_cache()
    fs.get(f"{folder}/", str(local), recursive=True)
    events = EventAccumulator(str(local), size_guidance={"scalars": 0})
    events.Reload()
    return events


def tensorboard_steps(fs: Any, folder: str, local: Path) -> List[int]:
    return [event.step for event in tensorboard_events(fs, folder, local).Scalars("train/loss")]


def hparams_of(events: Any) -> Dict[str, Any]:
    """The hyperparameters a run logged for TensorBoard's HParams view."""
    from tensorboard.plugins.hparams import plugin_data_pb2

    content = events.PluginTagToContent("hparams")["_hparams_/session_start_info"]
    info = plugin_data_pb2.HParamsPluginData.FromString(content).session_start_info
    return {key: value.number_value if value.HasField("number_value") else value.string_value
            for key, value in info.hparams.items()}


def test_a_missing_bucket_fails_before_training(tmp_path: Path, gcs_emulator: Dict[str, str]) -> None:
    proc = run_app([*ARGS, "output_dir=gs://no-such-bucket/run", f"hydra.run.dir={tmp_path}/hydra"],
                   cwd=tmp_path, env=gcs_emulator)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert ("error: output_dir=gs://no-such-bucket/run: bucket no-such-bucket does not exist (create it: gcloud "
            "storage buckets create gs://no-such-bucket)") in proc.stderr and "training:" not in proc.stdout


@pytest.mark.process
def test_a_resumed_run_logs_to_the_same_wandb_run(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    wandb_env = {"WANDB_SILENT": "true"}
    args = [*ARGS, "logger=wandb", "logger.wandb.mode=offline"]
    assert stop_with_sigterm(run_dir, env=wandb_env, args=args).returncode == 75
    proc = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=wandb_env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one file per attempt, as W&B writes them
    ids = {record.run.run_id for f in files for record in records(f) if record.WhichOneof("record_type") == "run"}
    assert len(ids) == 1 and {f.stem for f in files} == {f"run-{next(iter(ids))}"}


# Logged every 4 steps and checkpointed every 5 (and at the evaluations, every 15): the checkpoints before
# step 20 fall inside a logging window.
LOGGED = [*ARGS, "train.log_every=4", "logger=[csv,tensorboard]"]


def metric_rows(run_dir: Path) -> List[Tuple[str, str, str]]:
    """metrics.csv's rows (step, metric, value), the measured throughput and the time they were logged left out."""
    rows = [tuple(line.split(",")[:3]) for line in (run_dir / "metrics.csv").read_text().splitlines()]
    return [row for row in rows if not row[1].endswith("_per_second")]  # type: ignore[misc]


@pytest.mark.process
def test_sigkill_between_checkpoints_then_resume_logs_each_step_once_with_an_unbroken_runs_values(
        tmp_path: Path, shared_run: Callable[[str, Sequence[str]], Path]) -> None:
    """Killed after logging step 12, past its checkpoint of step 10 (or 15): resumed, the rows logged after
    that checkpoint are dropped and logged again, and the first loss logged after it is the mean over the
    same four steps, some of them trained before the kill: metrics.csv and TensorBoard's scalars are an
    unbroken run's, row for row."""
    whole = shared_run("resume-logged", LOGGED)
    run_dir = tmp_path / "run"
    for _attempt in range(5):
        proc = start([*LOGGED, f"hydra.run.dir={run_dir}"], tmp_path)
        wait_for_step(proc, run_dir / "train.log", 12)
        proc.kill()
        proc.communicate()
        newest = max(int(n[5:]) for n, done in checkpoints(run_dir).items() if done)
        if newest % 4 and any(int(row[0]) > newest for row in metric_rows(run_dir)[1:]):
            break  # killed inside a logging window, with rows logged past the checkpoint
        shutil.rmtree(run_dir)
    else:
        pytest.fail("never killed between a checkpoint and the next one")
    done = run_app([*LOGGED, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"resuming from checkpoint {run_dir / 'checkpoints' / f'step-{newest:06d}'}" in done.stdout
    assert "which this run logs again" in done.stdout
    assert metric_rows(run_dir) == metric_rows(whole)
    steps = [row[0] for row in metric_rows(run_dir) if row[1] == "train/loss"]
    assert steps == [str(step) for step in [*range(4, 51, 4), 50]]  # each once, the last step too
    assert scalars(run_dir / "tensorboard") == scalars(whole / "tensorboard")


def scalars(folder: Path) -> Dict[str, List[Tuple[int, float]]]:
    """Every scalar TensorBoard shows of a run, by tag: (step, value), in order; the throughput left out."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    return {tag: [(event.step, event.value) for event in events.Scalars(tag)] for tag in events.Tags()["scalars"]
            if not tag.endswith("_per_second")}
