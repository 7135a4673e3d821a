"""What an output folder already holds, and whether this run may go on there.

A folder holds one run. Started again with the same settings (the same identity: nli.config.identity), a
run continues from its newest checkpoint, or, finished, reports its results again. With other
settings it is refused before anything loads, each change listed, unless every change is one the
user accepts for continuing (``train.accept_changes``). A run so accepted continues from its newest
checkpoint with the new values (:func:`check_continuation` first refuses, with the reason, what that
checkpoint cannot carry out: a run cannot go back or be shortened, and a finished run must have
something to do), and every checkpoint after it, and results.json, record where it went on and with
what (``continued``).
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional

import yaml
from omegaconf import OmegaConf

from nli import contract
from nli.config import runfolder
from nli.config.identity import differences, digest, identity, own_folder, refuse
from nli.config.schema import TrainConfig
from nli.errors import CheckpointError, RunChanged
from nli.io.claim import Claim
from nli.io.storage import Storage
from nli.runtime import provenance
from nli.runtime.context import RunContext
from nli.runtime.distributed import World
from nli.train.checkpoint import Checkpoints, Snapshot
from nli.train.hooks import judge

log = logging.getLogger(__name__)


@dataclass
class Outputs:
    """Where the run writes, and what an earlier attempt of it left there."""

    storage: Storage  # the output directory
    checkpoints: Checkpoints
    context: RunContext
    world: World
    identity: Dict[str, Any]  # what the run computes (nli.config.identity): kept with every checkpoint
    claim: Optional[Claim]  # rank 0's hold on the folder: checked before each write of the run's state
    snapshot: Optional[Snapshot]  # the newest intact checkpoint, when resuming
    finished: Optional[Dict[str, Any]]  # results.json, when the run already finished
    warnings: List[str] = field(default_factory=list)  # settings that cannot take effect: logged, in results.json
    # The code, libraries, device, command (nli.runtime.provenance).
    provenance: Dict[str, Any] = field(default_factory=dict)
    # The prediction files this attempt wrote (predictions/, eval_predictions/): the final phase removes the others,
    # an earlier attempt's that no longer describe the run's model (nli.output.results.finish).
    predicted: List[str] = field(default_factory=list)

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)


def _recorded_config(context: RunContext, output_dir: str) -> Dict[str, Any]:
    """The resolved config with the directories the run writes to, as the folder's config.yaml records it."""
    train = {**context.resolved["train"], "checkpoint_dir": context.checkpoint_dir}
    return {**context.resolved, "output_dir": output_dir, "train": train}


def record_run(out: Outputs) -> None:
    """The folder's record of its run: config.yaml, the resolved config with the directories the run writes to, and
    overrides.yaml, the command's overrides as typed. Written once this attempt has loaded what it needs and restored
    its checkpoint, just before it trains (or evaluates): a command refused, failed or stopped before then (a
    continuation's eval.extra file missing, a resume on other hardware killed as it loads) leaves the record of the
    run the folder holds as it was."""
    with out.world.together():
        if out.world.is_main:
            resolved = _recorded_config(out.context, out.context.output_dir)  # rank 0's: the folder the run claimed
            # Together: a disk that fills between the two would leave this attempt's config beside the earlier one's
            # overrides (or none), the record of no run.
            out.storage.write_together({contract.CONFIG_FILE: OmegaConf.to_yaml(resolved),
                                        contract.OVERRIDES_FILE: OmegaConf.to_yaml(out.context.command)})


def earlier_run(train: TrainConfig, ident: Mapping[str, Any], storage: Storage,
                checkpoints: Checkpoints) -> Optional[Dict[str, Any]]:
    """The results of this very run if it already finished; None if it is to start or continue.
    Raises, touching nothing, where the folder holds another run or ``train.resume=false`` forbids it."""
    if ident.get("eval.only"):  # said before torch loads too (nli.config.command), where the command could tell
        runfolder.check_evaluation_folder(storage, storage.describe())
    newest = checkpoints.newest_step()
    if newest is not None and not train.resume:
        # Checkpoints in a train.checkpoint_dir stay where they are whatever the output folder: another one helps not.
        afresh = (f"another {own_folder()}" if checkpoints.where() == storage.describe(
            contract.CHECKPOINTS_DIR) else "another train.checkpoint_dir (or leave it unset)")
        raise CheckpointError(f"{checkpoints.where()} holds a checkpoint of step {newest} and train.resume=false "
                              f"refuses to continue or overwrite it. Choose {afresh} to start afresh, delete that "
                              "folder, or drop train.resume=false to continue")
    finished = _results(storage, newest)
    if finished is None and newest is None:
        _refuse_checkpoints_elsewhere(storage, checkpoints)
        return None  # a new run
    recorded = checkpoints.newest_recorded_step()  # a damaged newest manifest recorded nothing of the run
    if finished is not None and _these_results(finished, ident, checkpoints, recorded):
        log.info("this run already finished; its results are in %s", storage.describe(contract.RESULTS_FILE))
        return finished
    saved = _saved_identity(storage, checkpoints, recorded)
    changes = differences(saved, ident) if saved is not None else {}
    if saved is None and finished is not None and finished.get("identity") != digest(ident):
        changes = {"(settings)": "not recorded by the earlier run -> these"}
    what = "a finished run" if finished is not None else f"a run stopped at step {newest}"
    unaccepted = [key for key in changes if key not in train.accept_changes]
    if unaccepted and finished is None and not storage.exists(contract.CONFIG_FILE) \
            and checkpoints.where() != storage.describe(contract.CHECKPOINTS_DIR):
        # The output folder holds no run: the checkpoints are another run's, in a train.checkpoint_dir both were given
        # (a sweep's jobs, each its own output_dir). Said of the output folder, the refusal pointed at the wrong one.
        raise CheckpointError(f"train.checkpoint_dir={checkpoints.where()} holds the checkpoints of another run "
                              f"(step {newest}; other settings: {', '.join(changes)}), and {storage.describe()} no run "
                              "of its own. Nothing was changed. Give each run a train.checkpoint_dir of its own, or "
                              "leave it unset (each run's checkpoints then go in its output_dir)")
    if recorded is not None:
        _refuse_another_runs_checkpoints(storage, checkpoints, recorded)
    if unaccepted:
        raise refuse(storage.describe(), what, changes, saved or {}, checkpointed=newest is not None)
    if changes and newest is None:
        raise CheckpointError(f"{storage.describe()} holds {what} but no checkpoint to continue it from (none in "
                              f"{checkpoints.where()}): train.accept_changes goes on from the run's newest checkpoint. "
                              "Nothing was changed. Start the run with these settings in another output_dir; to "
                              "score its model on other sets, run eval.only=true with model.name_or_path=<its model/>")
    if recorded is not None:
        checkpoints.continued = checkpoints.continued_of(recorded)
    if changes:
        assert newest is not None
        checkpoints.continued.append({"step": newest, "changes": changes})  # said once checked (check_continuation)
        return None
    if finished is not None and newest is not None and _stale(finished, checkpoints.continued):
        log.info("%s holds the results of this run before it went on with new values; it continues from its newest "
                 "checkpoint, step %d", storage.describe(contract.RESULTS_FILE), newest)
        return None
    if finished is not None:
        log.info("this run already finished; its results are in %s", storage.describe(contract.RESULTS_FILE))
    return finished


def _refuse_checkpoints_elsewhere(storage: Storage, checkpoints: Checkpoints) -> None:
    """Refuses, touching nothing, to start afresh a run whose checkpoints are where its config.yaml says it kept them
    and this command does not look: train.checkpoint_dir is outside the identity (where checkpoints go cannot change
    the result), so a run stopped with another one would otherwise train again from step 0, its steps silently lost."""
    if not storage.exists(contract.CONFIG_FILE):
        return
    try:
        recorded = yaml.safe_load(storage.read_bytes(contract.CONFIG_FILE))
    except yaml.YAMLError:
        return  # no record to go by (_saved_identity says so where it matters)
    train = recorded.get("train") if isinstance(recorded, dict) else None
    if not isinstance(train, dict):
        return
    kept = train.get("checkpoint_dir")
    where = Storage(kept, key="train.checkpoint_dir").describe() if kept else storage.describe(contract.CHECKPOINTS_DIR)
    if where == checkpoints.where():
        return
    step = Checkpoints(Storage(where, key="train.checkpoint_dir"), keep=1, identity={}).newest_step()
    if step is None:
        return
    way = f"give train.checkpoint_dir={kept}" if kept else "leave train.checkpoint_dir unset, as it was"
    raise CheckpointError(f"{storage.describe()} holds a run stopped at step {step}, its checkpoints in {where}; "
                          f"this command keeps checkpoints in {checkpoints.where()}, where there are none, and would "
                          f"train it again from step 0. Nothing was changed. To continue it, {way}; or give this run "
                          f"its own {own_folder()}")


def _refuse_another_runs_checkpoints(storage: Storage, checkpoints: Checkpoints, step: int) -> None:
    """Refuses, touching nothing, checkpoints in a train.checkpoint_dir that another run's output folder still claims
    (its config.yaml keeps its checkpoints there): two runs of the same settings given one checkpoint folder, the
    second went on from the first's checkpoints, or reported it finished, as if they were its own. A run whose output
    folder is gone (lost, moved) is continued in this one, as a stopped run is continued in its own."""
    owner = checkpoints.owner_of(step)
    if owner is None or owner == storage.absolute() or checkpoints.where() == storage.describe(
            contract.CHECKPOINTS_DIR):
        return  # recorded by none (an earlier version), this run's own, or in its own folder
    theirs = Storage(owner)
    if theirs.exists(contract.CONFIG_FILE):
        try:
            recorded = yaml.safe_load(theirs.read_bytes(contract.CONFIG_FILE))
        except yaml.YAMLError:
            recorded = None  # whose checkpoints they are cannot be told from it: that folder's, as they say
        train = recorded.get("train") if isinstance(recorded, dict) else None
        kept = train.get("checkpoint_dir") if isinstance(train, dict) else None
        if not isinstance(train, dict) or (kept and Storage(kept).absolute() == checkpoints.storage.absolute()):
            raise CheckpointError(f"train.checkpoint_dir={checkpoints.where()} holds the checkpoints of the run in "
                                  f"{owner} (step {step}), not of this run's output folder, {storage.describe()}. "
                                  f"Nothing was changed. To continue that run, give output_dir={owner}; to start "
                                  "this one, give it a train.checkpoint_dir of its own, or leave it unset (its "
                                  "checkpoints then go in its output_dir)")
    log.warning("%s holds the checkpoints of the run in %s, a folder that no longer holds it: this run continues it "
                "from there in %s", checkpoints.where(), owner, storage.describe())


def record_code(out: Outputs) -> None:
    """The code this attempt trains with (nli.runtime.provenance.code_of), added to the run's record: each
    checkpoint keeps which code ran from which step. Where it is not the code of the steps before (a run
    requeued after a git pull, an edit, an upgrade), a warning says so, and results.json's
    ``provenance.code_history`` lists each attempt's code from the step it started at."""
    now = provenance.code_of(out.provenance)
    step = out.snapshot.step if out.snapshot is not None else 0
    history = out.checkpoints.code_history(step) if out.snapshot is not None else []
    changed = bool(history) and history[-1]["code"] != now
    if changed:
        out.warn(f"this run goes on from step {step} under other code than its steps before it "
                 f"({'; '.join(provenance.code_changes(history[-1]['code'], now))}): its figures come from both, "
                 "and results.json's provenance.code_history says which steps ran under which. To train under one, "
                 "start it afresh in another output_dir")
    if changed or not history:
        history.append({"step": step, "code": now})
    out.checkpoints.code = history
    if len(history) > 1:
        out.provenance["code_history"] = history


def check_continuation(train: TrainConfig, ident: Mapping[str, Any], storage: Storage, checkpoints: Checkpoints,
                       snapshot: Optional[Snapshot]) -> None:
    """Refuses, before anything loads or is written, new values (train.accept_changes) that the run
    cannot carry out from ``snapshot``, the checkpoint it continues from: a run cannot go back (early
    stopping judged again would have ended it before that step), be shortened below the steps it
    trained, or, finished, go on with nothing to do (no step to train, nothing new to write)."""
    if snapshot is None:
        return
    saved = checkpoints.identity_of(snapshot.step)
    changes = differences(saved, ident) if saved is not None else {}
    if not changes:
        return
    if checkpoints.continued:  # the step it goes on from: the newest intact checkpoint's
        checkpoints.continued[-1]["step"] = snapshot.step
    results = _results(storage, snapshot.step)
    finished = results is not None and not _stale(results, checkpoints.continued[:-1])
    what = f"{storage.describe()} holds a {'finished run' if finished else 'run'} at step {snapshot.step}"
    stopped = _stopped_early(train, changes, snapshot, what)
    total = _planned_steps(train, snapshot.state["progress"])
    shortens = {"train.max_steps", "train.epochs"} & set(changes)
    if shortens and total is not None and (total < snapshot.step or (total == snapshot.step and not finished)):
        why = ("it cannot be shortened" if total < snapshot.step else
               "it would end where it stands, without the final evaluation at its last step")
        raise RunChanged(f"{what}: {_length(train)} plans {total} steps, and the run already trained "
                         f"{snapshot.step}: {why}. Nothing was changed. Ask for more than {snapshot.step} steps to "
                         "train on, or start afresh in another output_dir")
    trains = stopped is None and (total is None or total > snapshot.step)
    writes = ("eval.extra" in changes or "eval.dir" in changes
              or ("train.predict" in changes and train.predict))
    if finished and not trains and not writes:
        why = (f"early stopping ends it at step {stopped} again" if stopped is not None else
               f"it has trained all the {total} steps {_length(train)} plans")
        raise RunChanged(f"{what}, and with the new values ({', '.join(changes)}) it would train no further and write "
                         f"nothing new: {why}. Nothing was changed. Ask for more steps, a larger "
                         "train.early_stopping.patience, or a new train.predict or eval.extra")
    log.warning("%s; continuing it from there with new values (train.accept_changes): %s", what,
                "; ".join(f"{key}: {change}" for key, change in changes.items()))


def _stopped_early(train: TrainConfig, changes: Mapping[str, str], snapshot: Snapshot, what: str) -> Optional[int]:
    """The step at which early stopping, under this run's settings, ends the run at or before ``snapshot``'s
    step (None if it goes on); refuses a run that it would have ended earlier, and new settings that a
    checkpoint without its evaluations cannot be judged by."""
    patience = train.early_stopping.patience
    if patience is None:
        return None
    history = snapshot.state["best"].get("history")
    if history is None:
        if any(key.startswith("train.early_stopping.") for key in changes):
            raise RunChanged(f"{what}, written by an earlier version that did not record its evaluations: early "
                             "stopping cannot be judged again under new train.early_stopping values. Nothing was "
                             "changed. Start the run afresh in another output_dir with the new values")
        earlier = snapshot.state.get("early_stopping")
        return earlier["stopped_at"] if earlier else None
    stopped = judge(history, patience=patience, min_delta=train.early_stopping.min_delta).stopped_at
    if stopped is not None and stopped < snapshot.step:
        raise RunChanged(f"{what}; with train.early_stopping.patience={patience}, min_delta="
                         f"{train.early_stopping.min_delta:g} early stopping would have ended it at step {stopped}: "
                         "a run cannot go back. Nothing was changed. Start the run afresh in another output_dir "
                         "with these values")
    return stopped


def _planned_steps(train: TrainConfig, progress: Mapping[str, Any]) -> Optional[int]:
    """The steps the run now plans, as nli.train.loop.Plan counts them; None where train.epochs decides it and the
    checkpoint cannot tell an epoch's size (one from before the checkpoints kept it, written in the first epoch: the
    loop then checks, once the data is in)."""
    if train.max_steps:
        return train.max_steps
    examples_per_epoch = progress.get("examples_per_epoch", 0)
    if not examples_per_epoch and progress["epoch"] >= 1:
        examples_per_epoch = (progress["examples"] - progress["examples_in_epoch"]) // progress["epoch"]
    if not examples_per_epoch:
        return None
    return math.ceil(train.epochs * math.ceil(examples_per_epoch / train.batch_size))


def _length(train: TrainConfig) -> str:
    """The setting that decides how long the run trains (nli.train.loop.Plan): train.max_steps where set."""
    return f"train.max_steps={train.max_steps}" if train.max_steps else f"train.epochs={train.epochs:g}"


def _stale(results: Mapping[str, Any], continued: List[Dict[str, Any]]) -> bool:
    """Whether ``results`` came before the run went on with new values (its checkpoints record more
    continuations than they do): the run stopped since, before its new end."""
    return list(results.get("continued", [])) != continued


def _results(storage: Storage, newest: Optional[int]) -> Optional[Dict[str, Any]]:
    """The folder's results.json, None where it has none. One that is not a run's results (a run writes it whole,
    at its end, so something else changed it) is refused by name, touching nothing: whether the run finished, and
    with what, cannot be told from it."""
    if not storage.exists(contract.RESULTS_FILE):
        return None
    try:
        results = json.loads(storage.read_bytes(contract.RESULTS_FILE))
    except ValueError as err:  # not JSON, or not UTF-8
        results, why = None, f"not JSON: {err}"
    else:
        why = "JSON, but not an object with the run's objective"
    if isinstance(results, dict) and "objective" in results:  # what the contract says every results.json holds
        return results
    again = (f"finishes the run again from its newest checkpoint (step {newest}): its final evaluation, export and "
             "results" if newest is not None else "runs it again: the folder holds no checkpoint to finish it from")
    raise CheckpointError(f"{storage.describe(contract.RESULTS_FILE)} is not a run's results ({why}). Nothing was "
                          f"changed. Restore it, or delete it: the same command then {again}")


def _these_results(finished: Mapping[str, Any], ident: Mapping[str, Any], checkpoints: Checkpoints,
                   recorded: Optional[int]) -> bool:
    """Whether results.json is this very run's, finished: it records these settings (its digest of them), and no
    continuation it does not know of (a run continued since, and stopped before its new end, has more in its
    checkpoints). Where the checkpoints' record or config.yaml is damaged or gone, results.json still says it."""
    went_on = checkpoints.continued_of(recorded) if recorded is not None else []
    return finished.get("identity") == digest(ident) and len(finished.get("continued") or []) >= len(went_on)


def _saved_identity(storage: Storage, checkpoints: Checkpoints, newest: Optional[int]) -> Optional[Dict[str, Any]]:
    """The earlier run's identity: its newest checkpoint's, else what its config.yaml gives."""
    if newest is not None:
        saved = checkpoints.identity_of(newest)
        if saved is not None:
            return saved
    if not storage.exists(contract.CONFIG_FILE):
        return None
    try:
        recorded = yaml.safe_load(storage.read_bytes(contract.CONFIG_FILE))
    except yaml.YAMLError as err:
        recorded, why = None, f"not YAML: {str(err).splitlines()[0]}"
    else:
        why = "empty" if recorded is None else "not a run's config"
    if isinstance(recorded, dict):
        return identity(recorded)
    log.warning("%s is %s: the run's settings are known from results.json alone", storage.describe(
        contract.CONFIG_FILE), why)
    return None
