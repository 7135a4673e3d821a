"""The task function ``train.py`` and ``python -m nli`` hand to Hydra; their ``--help`` is nli/config/help.py.

The one place a run's errors are handled: an error the user can fix (:class:`nli.errors.UserError`)
ends the run with its message and no traceback (in a sweep, it fails that job alone: nli.sweep.table),
and a run stopped by a signal, its checkpoint written, exits with status ``PREEMPTED`` (75) to be
run again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import os
import shutil
import signal
import sys
import time
import traceback
from pathlib import Path
from types import FrameType
from typing import Any, Callable, Dict, List, NoReturn, Optional, cast

from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf

from nli.config import command, runfolder
from nli.config.help import answer_help
from nli.config.identity import in_sweep
from nli.config.keys import built
from nli.config.schema import Accelerator, Config, config_dir
from nli.contract import CONFIG_FILE, OVERRIDES_FILE, PREEMPTED
from nli.errors import ConfigError, JobFailed, UserError
from nli.io.claim import ClaimedError
from nli.io.storage import Storage, write_failed
from nli.runtime import cpu, platform
from nli.runtime.context import RunContext
from nli.runtime.signals import (
    INTERRUPTED,
    Interrupted,
    Preempted,
    StopRequest,
    end_done,
    end_promptly,
    interruption,
    started,
    stop_while_starting,
    stopped_starting,
    take_held,
)
from nli.sweep import table as sweep

log = logging.getLogger(__name__)

def train(raw: DictConfig) -> float:
    """Hydra's task function: run, and return the objective for sweepers to maximise. The config's
    rules are checked before torch and transformers load (about 9 s), so a wrong value is answered
    in a second."""
    try:
        _guard_log_file()
        fresh = _fresh_run_dir()
        if (taken := runfolder.apply(raw, _typed(), _conf_dir())) is not None:  # eval.only=true of a run folder
            log.info("%s", taken)
        cfg = cast(Config, built(raw))  # every key and rule: a sweep's job, or a command nli.config.command left
        site = platform.detect()
        if int(site.process_env.get("RANK", "0")) != 0:
            _leave_log_file_to_rank_0()
        started()  # the command's start-up handler gives way to the run's
        # From here on a signal stops the run cleanly, and the machine's other runs count this one.
        with StopRequest(requeue=site.requeue_signal) as stop, cpu.Sharing(cfg.hw.cpu_threads,
                                                                           site.local_processes) as sharing:
            _preflight(cfg, site)
            context = run_context(cfg, raw, site)
            try:
                from nli import recipe  # torch and transformers: seconds

                return float(recipe.run(cfg, context, stop=stop, sharing=sharing)["objective"])
            except Preempted:
                stop.hand_over()  # the run has stopped: the platform may requeue the job now
                raise
            except BaseException as error:  # a signal, or an error it caused while a library imported
                stopped = interruption(error)
                if stopped is None:
                    raise
                stop.hand_over()
                raise stopped from error
    except Preempted as stop:
        _stop(f"preempted, resumable: {stop.signal} at step {stop.step}, checkpoint written. "
              "Run the same command again to continue")
    except Interrupted as stop:
        _stop(f"stopped by {stop.signal} {INTERRUPTED[stop.stage]}")
    except UserError as err:
        said = f"{err}{_held_by_the_same_second(err, raw)}"
        # The console gets it once, on stderr, as the exit's message; a folder another run holds keeps that run's log.
        _off_console(logging.ERROR, said, files=not isinstance(err, ClaimedError))
        if in_sweep():  # one job's mistake: the sweep goes on, and ends non-zero naming it (nli.sweep.table)
            raise JobFailed(f"error: {said}") from None
        _remove_if_only_attempt(fresh)
        raise SystemExit(f"error: {said}") from None
    except Exception as crash:  # a defect, not the user's: Hydra prints its traceback on the console, and the
        # run's train.log, which else ended at the crash's last log line, says how the run ended too
        _off_console(logging.ERROR, "the run crashed:\n" + "".join(traceback.format_exception(crash)).rstrip())
        raise


def entry(main: Callable[[], object], conf_dir: Path, argv: List[str]) -> None:
    """``train.py``'s and ``python -m nli``'s: ``--help`` answered from the config alone (nli.config.help), the
    command line checked before Hydra writes anything (nli.config.command), then Hydra's ``main``, and a sweep's
    table (nli.sweep.table)."""
    if not answer_help(argv, conf_dir, "train"):  # Hydra's own --help takes seconds (nli/config/help.py)
        # A process of a run on several machines leaves its data to the run, which stops every process at once where
        # one machine's copy is missing or differs (nli.recipe.load_data): refused here, the process stopped alone,
        # and the other machines' waited for it at the rendezvous until its timeout.
        several = int(platform.detect().process_env.get("WORLD_SIZE", "1")) > 1
        checked = command.check(argv, conf_dir, "train", data=not several)
        if checked.extra:  # Hydra's main reads sys.argv
            sys.argv = [*sys.argv, *checked.extra]
        try:
            with command.known_mode(checked):
                main()
            if take_held() is not None:  # a sweep's Ctrl-C held past its last job's start (nli.sweep.table.hold)
                raise KeyboardInterrupt
        except KeyboardInterrupt:  # Ctrl-C outside a run (a run takes it itself: exit 75), e.g. between a sweep's jobs
            print("interrupted (Ctrl-C)", file=sys.stderr)
            raise SystemExit(130) from None
        finally:  # a sweep whose job failed: Hydra raised before the sweep's end, its table comes now
            sweep.finish_open()
            take_held()  # none is left over for a later command in this process


def process(main: Callable[[], object], conf_dir: Path) -> None:
    """The ``__main__`` of ``train.py`` and ``python -m nli``: :func:`entry` with the process's arguments; a
    process whose run a signal stopped ends within seconds with ``PREEMPTED`` (nli.runtime.signals.end_promptly),
    and one whose work is done at once (nli.runtime.signals.end_done)."""
    stop_while_starting(_stopped_starting)
    try:
        entry(main, conf_dir, sys.argv[1:])
    except SystemExit as stop:
        if stop.code == PREEMPTED:
            end_promptly(PREEMPTED)  # a further signal, or a thread that holds the process, ends it with 75
            end_done(PREEMPTED)
        raise
    end_done()  # without Python's teardown of torch and the rest: seconds of every run's wall time


def _stopped_starting(signum: int, frame: Optional[FrameType]) -> None:
    """SIGTERM or Ctrl-C while the command starts, before its run or sweep handles it: the start-up handler's line
    and exit (nli.runtime.signals.stopped_starting), the line in the run's log too once Hydra has made it."""
    _off_console(logging.WARNING, f"stopped by {signal.Signals(signum).name} {INTERRUPTED['starting']}")
    for handler in logging.getLogger().handlers:
        handler.flush()
    stopped_starting(signum, frame)


def run_context(cfg: Config, raw: DictConfig, site: platform.Site) -> RunContext:
    """What the run is told besides its config, from Hydra and the platform: the output directory
    (output_dir, else the platform's, else the Hydra run directory), the checkpoint and log folders,
    the loggers' name for the run (the job's overrides), and for a sweep's job the sweep's name and the
    job's overrides (nli.sweep.table)."""
    hydra = HydraConfig.get() if HydraConfig.initialized() else None
    run_dir = str(hydra.runtime.output_dir) if hydra is not None else None
    output_dir = cfg.output_dir or site.output_dir or run_dir
    if output_dir is None:
        raise ConfigError("output_dir is not set and there is no Hydra run directory: set output_dir")
    context = RunContext(output_dir=output_dir,
                         resolved=cast(Dict[str, Any], OmegaConf.to_container(raw, resolve=True, enum_to_str=True)),
                         checkpoint_dir=cfg.train.checkpoint_dir or site.checkpoint_dir, log_dir=site.log_dir,
                         local_dir=run_dir, process_env=site.process_env)
    if hydra is None:
        return context
    name, command = str(hydra.job.override_dirname) or None, [str(each) for each in hydra.overrides.task]
    if not in_sweep():
        return dataclasses.replace(context, name=name, command=command)
    return dataclasses.replace(context, name=name, command=command, group=Path(str(hydra.sweep.dir)).name,
                               overrides=sweep.override_columns(list(hydra.overrides.task)))


def _held_by_the_same_second(err: UserError, raw: DictConfig) -> str:
    """What to add to the refusal ``err`` where another run holds the folder that Hydra named for this command, none
    typed: the default, outputs/<task>/<time>, is named to the second, so two commands started in the same second (a
    shell loop's ``&``, two terminals) share it, and "in use by another run" names a run never pointed there."""
    if not isinstance(err, ClaimedError) or not HydraConfig.initialized() or in_sweep() or \
            OmegaConf.select(raw, "output_dir"):  # a local output_dir is Hydra's run directory too: typed
        return ""
    hydra = HydraConfig.get()
    if any(str(each).lstrip("+~").startswith("hydra.run.dir=") for each in hydra.overrides.hydra):
        return ""
    if not str(err).startswith(f"{hydra.runtime.output_dir} is in use"):  # a train.checkpoint_dir's, the platform's
        return ""
    return (f". This command named no folder, and Hydra's default, {hydra.run.dir}, is named to the second: commands "
            "started in the same second share it. Give each its own hydra.run.dir (or output_dir)")


def _typed() -> List[str]:
    """The run's overrides as typed (a sweep's job: its own); none where Hydra did not start it."""
    return [str(each) for each in HydraConfig.get().overrides.task] if HydraConfig.initialized() else []


def _conf_dir() -> Path:
    """The folder Hydra composed the run's config from (its primary source), else the project's."""
    if HydraConfig.initialized():
        for source in HydraConfig.get().runtime.config_sources:
            if source.provider == "main" and source.schema == "file":
                return Path(str(source.path))
    return config_dir()


def _stop(message: str) -> NoReturn:
    """A run stopped by a signal: the message in its log and on stderr, and the status that says "run
    me again"."""
    _off_console(logging.WARNING, message)
    print(message, file=sys.stderr)
    raise SystemExit(PREEMPTED) from None


# What a refused attempt writes into a run folder before it stops: its log, and the folder's record.
ATTEMPT_FILES = {"train.log", CONFIG_FILE, OVERRIDES_FILE}


def _fresh_run_dir() -> Optional[Path]:
    """A single run's Hydra run directory where it holds nothing but a log (this attempt's, or a refused
    one's before it): a refusal takes it away again (:func:`_remove_if_only_attempt`)."""
    if not HydraConfig.initialized() or in_sweep():
        return None  # a sweep's job folder keeps the log its table's error points to
    folder = Path(str(HydraConfig.get().runtime.output_dir))
    return folder if folder.is_dir() and {path.name for path in folder.iterdir()} <= {"train.log"} else None


def _remove_if_only_attempt(folder: Optional[Path]) -> None:
    """A refused run leaves no folder behind where it made one and wrote nothing else there, nor the empty
    folders above it (``outputs/mnli/`` of Hydra's default ``outputs/mnli/<time>``), up to the directory the
    command ran in."""
    if folder is not None and folder.is_dir() and {path.name for path in folder.iterdir()} <= ATTEMPT_FILES:
        here = Path.cwd().resolve()
        if folder.resolve() == here or folder.resolve() in here.parents:  # hydra.run.dir=.: the folder stays
            for name in ATTEMPT_FILES:
                (folder / name).unlink(missing_ok=True)
            return
        shutil.rmtree(folder, ignore_errors=True)
        for parent in folder.resolve().parents:
            if here not in parent.parents:
                break
            try:
                parent.rmdir()  # only an empty one
            except OSError:
                break


def _leave_log_file_to_rank_0() -> None:
    """A process of a run other than its first (rank 0) writes nothing into the run's log, train.log: rank 0 tells
    the run there, and another rank's refusal reaches it (nli.runtime.distributed.World.together). Each process's
    own output (torchrun's console) keeps its lines. Every rank appended to the one file: each warning twice, and
    rank 1's lines not told from rank 0's."""
    root = logging.getLogger()
    for handler in [each for each in root.handlers if isinstance(each, logging.FileHandler)]:
        root.removeHandler(handler)
        handler.close()


def _guard_log_file() -> None:
    """The run's log file (train.log, Hydra's FileHandler) on a disk that fills (or a quota reached, or a read-only
    mount): one warning on the console, and the run goes on logging there alone. Left to logging, every line after
    the disk filled printed a traceback ("--- Logging error ---") on stderr, hundreds in a run. The log file keeps
    what it had; the run's last lines say it was cut short (nli.output.results)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(_log_file_failed, handler)  # type: ignore[method-assign]


def _log_file_failed(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    error = sys.exc_info()[1]
    if error is None or not write_failed(error):
        logging.FileHandler.handleError(handler, record)  # logging's own report of any other failure
        return
    # Left among the root's handlers (the one that failed is being called from that very list), but writing nothing:
    # its emit would open the file again.
    handler.emit = lambda record: None  # type: ignore[method-assign]
    handler.setLevel(logging.CRITICAL + 1)
    with contextlib.suppress(OSError, ValueError):
        handler.close()  # its buffer cannot be written either
    reason = (error.strerror if isinstance(error, OSError) else None) or str(error)
    handler.cut_short = f"cut short at {time.strftime('%H:%M:%S')}: {reason}"  # type: ignore[attr-defined]
    log.warning("the run's log %s could not be written (%s): the run goes on, its lines on the console only (make "
                "room on that disk: what else the run writes there fails too)", handler.baseFilename, reason)


def _off_console(level: int, message: str, *, files: bool = True) -> None:
    """``message`` to every log handler but the console's (train.log unless not ``files``, and whoever else
    listens: the Vertex AI job's callback reports the last error): the console shows it once, on stderr."""
    record = log.makeRecord(log.name, level, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        in_file = isinstance(handler, logging.FileHandler)  # a FileHandler is a StreamHandler too
        console = isinstance(handler, logging.StreamHandler) and not in_file
        if not console and (files or not in_file):
            handler.handle(record)


def _preflight(cfg: Config, site: platform.Site) -> None:
    """A Cloud Storage output folder's bucket and credentials, and a model in a bucket (copied to its
    local cache), checked before torch loads in a run of one process: a wrong one is answered in seconds, not
    after the import (the run's setup checks all the rest). A run of several processes checks them once its
    processes have met (nli.recipe), so that one's refusal stops them all: made here, on rank 0 alone, it left
    the others waiting for it at the rendezvous (hw.rendezvous_timeout_minutes) where no launcher ends them
    (Slurm's tasks).
    On XLA, the TPU asked of PyTorch/XLA before datasets and transformers import it: on its own it
    falls back to the CPU where it finds none, and the run would train there, slowly, unsaid."""
    if cfg.hw.accelerator == Accelerator.xla:
        os.environ.setdefault("PJRT_DEVICE", "TPU")
    if int(site.process_env.get("WORLD_SIZE", "1")) > 1:
        return
    url = cfg.output_dir or site.output_dir
    if url and "://" in url:
        Storage(url).check_writable()
    model = cfg.model.name_or_path
    if model and "://" in model and not cfg.eval.only:
        from nli.model.bucket import local_copy

        local_copy(model)  # a wrong bucket or path answered now; the run reads the copy (nli.model.build.from_bucket)
