"""What a run writes at its end: each class's figures and each eval example's prediction, results.json
(written last: its presence says the run is done), and the list of the run's files."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Mapping, Tuple

from nli import contract
from nli.evaluate import per_class, reliability
from nli.evaluate.evaluation import Evaluation
from nli.evaluate.oom import Evaluations
from nli.output.folder import Outputs
from nli.tracking.loggers import Trackers

log = logging.getLogger(__name__)


def analyse(evaluated: List[Tuple[Evaluations, Evaluation]], trackers: Trackers, out: Outputs, *, step: int,
            save_predictions: bool) -> Dict[str, Any]:
    """The final evaluations' per-class figures and confusion matrices, to the loggers (at ``step``) and
    for results.json, with each split's calibration (nli.evaluate.reliability); with ``save_predictions``,
    each eval split's predictions under eval_predictions/."""
    scored = [(evaluations.evaluator, evaluation) for evaluations, evaluation in evaluated]  # the batches that fit
    analyses = per_class.analyse(scored)
    for warning in per_class.warnings_of(scored, analyses):
        out.warn(warning)  # logged, and in results.json's warnings
    if out.world.is_main:
        trackers.log_classes(analyses, step=step)
        if save_predictions:
            if out.claim is not None:
                out.claim.check()
            for name, text in per_class.files(scored):
                out.storage.write_text(name, text)
                out.predicted.append(name)
    if save_predictions:
        log.info("each eval example's prediction written to %s", out.storage.describe(per_class.FOLDER))
    return {**per_class.results(analyses), **reliability.results(scored)}  # calibration beside per_class


def finish(results: Dict[str, Any], trackers: Trackers, out: Outputs) -> Dict[str, Any]:
    """results.json, written last (its presence says the run is done), and the loggers' summary."""
    # Before the status, which stays last: where the numbers came from, and what could not take effect.
    extra = {**({"provenance": out.provenance} if out.provenance else {}),
             **({"warnings": out.warnings} if out.warnings else {})}
    results = {**{k: v for k, v in results.items() if k != "status"}, **extra, "status": results.get("status")}
    if out.world.is_main:
        if out.claim is not None:
            out.claim.check()
        _remove_stale(out)
        out.storage.write_text(contract.RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    trackers.finish(results)
    log.info("results: %s", summary(results))
    if out.world.is_main:
        log.info("%s", _files(out, trackers, exported="evaluated_model" not in results))
    out.world.barrier()  # no rank returns before the run's outputs are written
    return results


def _remove_stale(out: Outputs) -> None:
    """The prediction files an earlier attempt of the run left and this one did not write (train.predict or
    eval.save_predictions since turned off, an eval.extra set dropped): they describe another model, and the report
    tools would read them as this one's. Removed after this attempt wrote its own and before results.json, so an
    attempt stopped in between leaves them to the next, which writes its files again and removes the same."""
    written = set(out.predicted)
    for folder in (contract.PREDICTIONS_DIR, per_class.FOLDER):
        stale = [name for name in out.storage.files_under(folder) if name not in written]
        for name in stale:
            out.storage.remove(name)
        for sub in sorted({str(PurePosixPath(name).parent) for name in stale} - {folder}, reverse=True):
            if not out.storage.files_under(sub):
                out.storage.remove(sub)  # a dropped eval.extra set's own folder (eval_predictions/hans/), now empty
        if stale:
            log.info("removed %s: an earlier attempt's, not written by this one", ", ".join(stale))
        if not out.storage.files_under(folder):
            out.storage.remove(folder)  # no empty folder left for the file list to name


# Figures of results.json that describe how the run went, not how well its model does.
HOW_IT_WENT = {"train_examples_per_second", "train_tokens_per_second", "eval_examples_per_second", "train_seconds",
               "peak_memory_bytes", "xla_compile_seconds"}


def summary(results: Mapping[str, Any]) -> str:
    """The run's figures in a line: its metrics, and how long it trained; results.json holds every figure."""
    scores = ", ".join(f"{key}={value:.4f}" for key, value in results.items()
                       if isinstance(value, float) and key not in HOW_IT_WENT)
    steps, seconds, best = (results.get(key) for key in ("train_steps", "train_seconds", "best_step"))
    trained = "" if steps is None else f"; {steps} steps"  # an evaluation-only run trained none
    trained += f" in {seconds:.1f} s" if steps is not None and isinstance(seconds, float) else ""
    trained += f", the best at step {best}" if steps is not None and best is not None else ""
    trained += f"; pruned by its search at step {results['pruned_at']}" if "pruned_at" in results else ""
    skipped = results.get("train_skipped_steps")
    trained += f"; {skipped} of them skipped, their loss or gradients not finite" if skipped else ""
    return f"{scores}{trained} (every figure in {contract.RESULTS_FILE})"


def _cut_short(log_file: Path) -> str:
    """`` (cut short at <time>: <why>)`` where the run's log handler stopped writing ``log_file`` (a full disk:
    nli.cli), so that the list does not pass it off as the run's whole log; else nothing."""
    for handler in logging.getLogger().handlers:
        said = getattr(handler, "cut_short", None)
        if isinstance(handler, logging.FileHandler) and said and handler.baseFilename == os.path.abspath(log_file):
            return f" ({said}; the rest is in the console's output)"
    return ""


def _files(out: Outputs, trackers: Trackers, *, exported: bool) -> str:
    """The run's last lines: where its results, model, log and metrics are."""
    places = {"results": out.storage.describe(contract.RESULTS_FILE)}
    if exported:
        places["model"] = out.storage.describe(contract.MODEL_DIR)
    if out.storage.list(contract.PREDICTIONS_DIR):
        places["predictions"] = out.storage.describe(contract.PREDICTIONS_DIR)
    if out.storage.list(per_class.FOLDER):
        places["eval predictions"] = out.storage.describe(per_class.FOLDER)
    log_file = Path(out.context.local_dir, "train.log") if out.context.local_dir else None
    if log_file is not None and log_file.exists() and not log_file.is_dir():
        places["log"] = str(log_file) + _cut_short(log_file)
    places.update(trackers.places())
    width = max(map(len, places))
    return "The run's files:\n" + "\n".join(f"  {name:<{width}}  {where}" for name, where in places.items())
