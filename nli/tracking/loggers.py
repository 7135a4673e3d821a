"""Where training metrics go besides the log: any number of loggers, each a class named by its
config's ``_target_`` (``conf/logger/``). A new logger is a YAML file and a class with the three
methods of :class:`Tracker`; ``logger=[wandb,tensorboard]`` runs several at once.

Loggers write their files on local disk (``RunInfo.log_dir``). Where those files belong in a bucket
(a ``gs://`` output, or Vertex AI's ``AIP_TENSORBOARD_LOG_DIR``), :class:`LogMirror` copies them
there at every checkpoint and at the end, so a job that is preempted or ends keeps them.
"""

from __future__ import annotations

import csv
import io
import logging
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, NamedTuple, Optional, Protocol, Sequence

from hydra.errors import InstantiationException
from hydra.utils import get_object, instantiate
from omegaconf import OmegaConf

from nli.config.schema import LoggerConfig, WandbConfig, WandbMode
from nli.contract import CLASS_FIGURES, MODEL_DIR
from nli.errors import ConfigError, StorageError, UserError
from nli.io.storage import Storage, write_refusal
from nli.runtime.context import RunContext

if TYPE_CHECKING:
    from wandb.sdk.wandb_settings import Settings

    from nli.evaluate.per_class import SplitAnalysis

log = logging.getLogger(__name__)

PER_CLASS_CSV, CONFUSION_CSV = "per_class.csv", "confusion.csv"  # the csv logger's, beside its metrics' file


class RunInfo(NamedTuple):
    """What every logger is told about the run (not a dataclass: instantiate() would take that for a config)."""

    name: str  # the Hydra job's overrides (optimizer.lr=1e-05,seed=2), else the output folder's name
    group: Optional[str]  # the sweep's name: the jobs of one multirun share it
    config: Dict[str, Any]  # the resolved config
    log_dir: Path  # a local directory for the loggers' files
    resume_id: Optional[str]  # the logger's run id from the checkpoint this run resumes, if any
    overrides: Dict[str, str] = {}  # a sweep's job: its overrides (key -> value as typed), else none
    # A training run: the step its checkpoint left off at (0: none). What an earlier attempt logged after
    # it (a run killed between checkpoints) is dropped where the logger's files allow, as this run logs it again.
    resume_step: Optional[int] = None
    # Where the exported model is once the run ends (a local folder or a bucket URL): a training run's model/;
    # None for an evaluation, which exports nothing.
    model_dir: Optional[str] = None


class Tracker(Protocol):
    run_id: Optional[str]  # kept in checkpoints, so that a resumed run logs to the same run

    def log(self, metrics: Mapping[str, float], *, step: int) -> None: ...

    def finish(self, summary: Mapping[str, Any]) -> None: ...


class WandbTracker:
    """W&B decides what the config leaves null (mode, project, entity): its WANDB_* variables, its
    settings file, its defaults; only the keys the config sets go to ``wandb.init``, where they win."""

    def __init__(self, *, run: RunInfo, mode: Optional[WandbMode], project: Optional[str], entity: Optional[str],
                 group: Optional[str], tags: List[str], log_model: bool = False) -> None:
        import wandb  # deferred: slow to import, and only needed with logger=wandb

        self._model_dir = run.model_dir if log_model else None
        if log_model and run.model_dir is None:
            log.info("logger.wandb.log_model=true: this run exports no model (an evaluation), so it logs none")

        # A sweep's job: its overrides as tags (W&B allows 64 characters) and under `overrides` in the
        # config, to filter and group the sweep's runs by what was swept.
        swept = [f"{key}={value}"[:64] for key, value in run.overrides.items()]
        config = {**run.config, "overrides": run.overrides} if run.overrides else run.config
        run_id = run.resume_id or _earlier_run(run.log_dir)
        self._run = wandb.init(**wandb_choices(mode, project, entity), group=group or run.group,
                               tags=list(dict.fromkeys([*tags, *swept])), name=run.name, config=config,
                               dir=str(run.log_dir), id=run_id, resume="allow" if run_id else None)
        self.run_id: Optional[str] = self._run.id
        self.where = self._run.url or self._run.dir  # offline: the run's folder, for `wandb sync`

    @staticmethod
    def check(cfg: WandbConfig) -> None:
        """Stops a run that W&B would log online without credentials, starting nothing: ``wandb.init``
        would stop it only once the model is loaded, with a traceback (or a prompt, on a terminal).
        Online and the credentials are decided as ``wandb.init`` decides them (its settings, its
        own lookup of WANDB_API_KEY, the netrc entry for its host, its settings file)."""
        from wandb.errors import AuthenticationError
        from wandb.sdk.lib import wbauth

        settings = _wandb_settings(cfg.mode)
        if settings._offline or settings._noop:
            return
        try:  # prompt=False: look, never ask; update_session=False: leave wandb's session as it was
            auth = wbauth.authenticate_session(host=settings.base_url, source="nli", prompt=False,
                                               update_session=False)
        except AuthenticationError as err:
            raise ConfigError(f"logger=wandb cannot use the W&B credentials it found: {err} {_WAYS_ON}") from None
        if auth is None:
            raise ConfigError(f"logger=wandb would log online ({_mode_source(cfg.mode)}) and finds no W&B API key. "
                              f"{_WAYS_ON}")

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        self._run.log(dict(metrics), step=step)

    def log_classes(self, analyses: Sequence["SplitAnalysis"], *, step: int) -> None:
        """Each split's per-class figures as a table (``eval/per_class/<split>``) and its confusion matrix as
        W&B's confusion-matrix chart (``eval/confusion_matrix/<split>``), made from the counts."""
        import wandb

        logged: Dict[str, Any] = {}
        for each in analyses:
            logged[f"eval/per_class/{each.split}"] = wandb.Table(
                columns=["label", *CLASS_FIGURES],
                data=[[label, *(figures[name] for name in CLASS_FIGURES)] for label, figures in each.per_class.items()])
            cells = [[gold, predicted, each.matrix[i][j]] for i, gold in enumerate(each.labels)
                     for j, predicted in enumerate(each.labels)]
            # wandb.plot.confusion_matrix's own table and chart, from counts rather than one entry per example
            logged[f"eval/confusion_matrix/{each.split}"] = wandb.plot_table(
                "wandb/confusion_matrix/v1", wandb.Table(columns=["Actual", "Predicted", "nPredictions"], data=cells),
                {"Actual": "Actual", "Predicted": "Predicted", "nPredictions": "nPredictions"},
                {"title": f"confusion matrix: {each.split}"})
        self._run.log(logged, step=step)

    def finish(self, summary: Mapping[str, Any]) -> None:
        """The run's summary is results.json (besides the last value of each logged series, as W&B keeps
        it); with ``log_model``, the exported model is the run's ``model`` artifact."""
        self._run.summary.update(dict(summary))
        if self._model_dir is not None:
            self._log_model(self._model_dir, summary)
        self._run.finish()

    def _log_model(self, model_dir: str, results: Mapping[str, Any]) -> None:
        """model/ as an artifact of type ``model``, named after the run (``model-<run id>``; a run resumed
        or started again logs a new version of it), its metadata the best step and objective. A local
        folder is uploaded; one in a bucket is logged as a reference to it (W&B reads it from there)."""
        import wandb

        artifact = wandb.Artifact(f"model-{self._run.id}", type="model",
                                  metadata={key: results[key] for key in ("best_step", "objective") if key in results})
        if "://" in model_dir:
            artifact.add_reference(model_dir.rstrip("/"))
        else:
            artifact.add_dir(model_dir)
        self._run.log_artifact(artifact, aliases=["best"])


def _earlier_run(log_dir: Path) -> Optional[str]:
    """The W&B run an earlier attempt in this folder started, from W&B's own record there (``wandb/latest-run``,
    a link to ``[offline-]run-<time>-<id>``): an attempt stopped before its first checkpoint, or an evaluation,
    which writes none, continues that run rather than leaving it beside a new one."""
    latest = log_dir / "wandb" / "latest-run"
    if not latest.is_symlink():
        return None
    name = Path(os.readlink(latest)).name
    return name.rsplit("-", 1)[1] if name.count("-") >= 2 else None


_WAYS_ON = ("Log in once with `wandb login`, or set WANDB_API_KEY, or log offline with logger.wandb.mode=offline "
            "(or WANDB_MODE=offline) and upload the run later with `wandb sync`.")


def wandb_choices(mode: Optional[WandbMode], project: Optional[str], entity: Optional[str]) -> Dict[str, Any]:
    """The ``wandb.init`` arguments of what the config sets: the rest W&B decides."""
    chosen = {"mode": WandbMode(mode).value if mode is not None else None,
              "project": project or _default_project(), "entity": entity}
    return {key: value for key, value in chosen.items() if value is not None}


def _wandb_settings(mode: Optional[WandbMode]) -> "Settings":
    """W&B's settings for this process (its variables and settings files), with the config's mode
    over them as ``wandb.init(mode=...)`` puts it. Reads files only: starts no W&B process."""
    from wandb.sdk import wandb_setup

    settings = wandb_setup.singleton().settings.model_copy()
    if mode is not None:
        settings.mode = WandbMode(mode).value
    return settings


def _mode_source(mode: Optional[WandbMode]) -> str:
    """Who chose online, for the message: the config, WANDB_MODE, or W&B's default."""
    if mode is not None:
        return f"logger.wandb.mode={WandbMode(mode).value}"
    if os.environ.get("WANDB_MODE"):
        return f"WANDB_MODE={os.environ['WANDB_MODE']}"
    return "W&B's default mode; logger.wandb.mode and WANDB_MODE are unset"


def _default_project() -> Optional[str]:
    """None where W&B has a project of its own (WANDB_PROJECT, its settings file), else ``nli``:
    W&B alone would file the run under "uncategorized"."""
    return None if _wandb_settings(None).project else "nli"


# What TensorBoard's HParams view shows of every run, besides a sweep's own overrides.
HPARAMS = ("task.name", "model.name_or_path", "optimizer.lr", "optimizer.weight_decay", "schedule.warmup_ratio",
           "train.batch_size", "train.epochs", "train.max_steps", "data.max_seq_length", "precision.dtype", "seed")


class TensorBoardTracker:
    """Scalars as they are logged; at the end the run's hyperparameters with its objective (the
    HParams plugin), so that a sweep's runs compare side by side."""

    run_id = None  # a resumed run appends to the same directory

    def __init__(self, *, run: RunInfo, subdir: str) -> None:
        from torch.utils.tensorboard import SummaryWriter

        # purge_step: TensorBoard drops the earlier attempt's events from that step on as it reads them; an
        # evaluation (no resume_step) logs everything again, at step 0.
        purge = run.resume_step + 1 if run.resume_step is not None else 0
        self._writer = SummaryWriter(log_dir=str(run.log_dir / subdir), purge_step=purge)
        self.where = run.log_dir / subdir
        self._hparams = hparams(run)
        # The whole resolved config, under TensorBoard's Text tab (Markdown: a code block keeps its layout).
        self._writer.add_text("config", f"```yaml\n{OmegaConf.to_yaml(run.config)}```")

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for key, value in metrics.items():
            self._writer.add_scalar(key, value, global_step=step)

    def log_classes(self, analyses: Sequence["SplitAnalysis"], *, step: int) -> None:
        """Each split's per-class figures and confusion matrix as Markdown tables, under the Text tab
        (``eval/per_class/<split>``, ``eval/confusion_matrix/<split>``)."""
        for each in analyses:
            table = [[label, *(_figure(figures[name]) for name in CLASS_FIGURES)]
                     for label, figures in each.per_class.items()]
            self._writer.add_text(f"eval/per_class/{each.split}", markdown(["label", *CLASS_FIGURES], table),
                                  global_step=step)
            self._writer.add_text(f"eval/confusion_matrix/{each.split}", markdown(
                ["gold \\ predicted", *each.labels], [[gold, *row] for gold, row in zip(each.labels, each.matrix)]),
                global_step=step)

    def flush(self) -> None:
        self._writer.flush()

    def finish(self, summary: Mapping[str, Any]) -> None:
        metrics = {"objective": float(summary["objective"])} if "objective" in summary else {}
        self._writer.add_hparams(self._hparams, metrics, run_name=".")  # ".": this run's own folder
        self._writer.close()


def markdown(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table, as TensorBoard's Text tab draws one."""
    return "\n".join(["| " + " | ".join(map(str, header)) + " |", "|" + "---|" * len(header),
                      *("| " + " | ".join(map(str, row)) + " |" for row in rows)])


def _figure(value: float) -> str:
    return str(value) if isinstance(value, int) else f"{value:.4f}"


def hparams(run: RunInfo) -> Dict[str, Any]:
    """The run's main settings and a sweep's overrides, as values TensorBoard takes (numbers, text)."""
    chosen = {key: OmegaConf.select(OmegaConf.create(run.config), key) for key in HPARAMS}
    chosen.update(run.overrides)
    return {key: value if isinstance(value, (int, float, str, bool)) else str(value)
            for key, value in chosen.items() if value is not None}


class CsvTracker:
    """Rows of ``step,metric,value,wall_time`` (when it was logged, in Unix seconds, as TensorBoard's), appended
    as they come. A resumed run goes on in the same file, first dropping the rows an earlier attempt logged after
    the checkpoint it resumes from: the file then holds each step once, as an unbroken run's does. A file begun
    before the wall_time column goes on without it.

    Every write goes through the run's storage (nli.io.storage): a disk that is full (or over quota, or read-only)
    is a StorageError naming the file and the fix, and a row it stopped part-way is cut back to the last whole row,
    as is one an earlier attempt left so (the file stays one the report reads)."""

    run_id = None
    COLUMNS = "step,metric,value,wall_time"

    def __init__(self, *, run: RunInfo, file: str) -> None:
        self._path = run.log_dir / file
        self.where = self._path
        self._storage = Storage(str(self._path.parent), key="the csv logger's folder")
        self._name = self._path.name
        text = self._read()
        if text and not text.endswith("\n"):  # a row an earlier attempt was stopped in the middle of writing
            whole = text[:text.rfind("\n") + 1] or self.COLUMNS + "\n"
            log.warning("%s: its last row was cut short (%r), by a full disk or a stop in the middle of writing it; "
                        "it is left out", self._path, text[text.rfind("\n") + 1:])
            self._storage.write_text(self._name, whole)
            text = whole
        if not text:  # none yet, or one whose header a full disk kept out: the header, as a new file's
            self._storage.append_text(self._name, self.COLUMNS + "\n")
            text = self.COLUMNS + "\n"
        if run.resume_step is not None:
            self._drop_after(run.resume_step)
        self._timed = text.partition("\n")[0].strip() == self.COLUMNS

    def _read(self) -> str:
        return self._storage.read_bytes(self._name).decode() if self._storage.exists(self._name) else ""

    def _rows(self) -> List[List[str]]:
        return list(csv.reader(io.StringIO(self._read(), newline="")))

    def _drop_after(self, step: int) -> None:
        """Keep the rows up to ``step`` (and any whose step is not a number: not ours to judge); the file is
        replaced whole, so a kill meanwhile leaves the old one."""
        rows = self._rows()
        kept = [row for row in rows if not (row and row[0].isdigit() and int(row[0]) > step)]
        if len(kept) == len(rows):
            return
        log.info("%s: dropped the %d row(s) logged after step %d, which this run logs again", self._path,
                 len(rows) - len(kept), step)
        self._rewrite(kept)

    def _rewrite(self, rows: Sequence[Sequence[str]]) -> None:
        self._storage.write_text(self._name, _csv_text(rows))

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        when = (round(time.time(), 3),) if self._timed else ()
        self._storage.append_text(self._name, _csv_text([(step, key, value, *when) for key, value in metrics.items()]))

    def log_final(self, metrics: Mapping[str, float], *, step: int) -> None:
        """``metrics`` at ``step`` in place of the rows of theirs an earlier attempt logged there: a run's figures
        of its end, which an attempt that finishes a stopped run (its training whole, resumed at that very step;
        an evaluation-only run) logs again."""
        rows = self._rows()
        kept = [row for row in rows if not (len(row) > 1 and row[0] == str(step) and row[1] in metrics)]
        if len(kept) < len(rows):
            self._rewrite(kept)
        self.log(metrics, step=step)

    def log_classes(self, analyses: Sequence["SplitAnalysis"], *, step: int) -> None:
        """``per_class.csv`` (split, label, precision, recall, f1, support) and ``confusion.csv`` (split, gold,
        predicted, count: every cell) beside the metrics' file, of the final evaluation: each written whole."""
        self._storage.write_text(PER_CLASS_CSV, _csv_text(
            [["split", "label", *CLASS_FIGURES],
             *([each.split, label, *(figures[name] for name in CLASS_FIGURES)]
               for each in analyses for label, figures in each.per_class.items())]))
        self._storage.write_text(CONFUSION_CSV, _csv_text(
            [["split", "gold", "predicted", "count"],
             *([each.split, gold, predicted, each.matrix[i][j]] for each in analyses
               for i, gold in enumerate(each.labels) for j, predicted in enumerate(each.labels))]))

    def finish(self, summary: Mapping[str, Any]) -> None:
        pass


def _csv_text(rows: Sequence[Sequence[Any]]) -> str:
    """Rows as CSV, as csv.writer writes them into a file opened with newline="" (its lines end in CRLF)."""
    stream = io.StringIO(newline="")
    csv.writer(stream).writerows(rows)
    return stream.getvalue()


class Trackers:
    """The run's loggers, as one. A checkpoint keeps each logger's run id (``state_dict``), and a
    resumed run hands it back before the loggers start, so W&B continues the same run."""

    def __init__(self, configs: Mapping[str, LoggerConfig], *, enabled: bool = True) -> None:
        self._enabled = enabled  # only rank 0 logs
        self._configs = dict(configs) if enabled else {}
        self._resume_ids: Dict[str, Optional[str]] = {}
        self._started: Dict[str, Tracker] = {}
        self._mirror: Optional[LogMirror] = None

    def check(self) -> None:
        """What each logger needs before it starts (an online W&B logger: its API key), checked
        without starting any: the recipe calls it before the model loads. A logger's class may have
        a ``check(cfg)``; one without has nothing to check."""
        for cfg in self._configs.values():
            check = getattr(get_object(cfg._target_), "check", None)
            if check is not None:
                check(cfg)

    def start(self, run: RunInfo, *, remote: Optional[str] = None) -> None:
        """Starts every logger; ``remote``: the bucket folder where their files (and the rest of
        ``run.log_dir``) belong, copied there by :meth:`sync`."""
        self.check()  # again here, so that it holds even where a recipe did not check first
        if remote and self._enabled:
            self._mirror = LogMirror(run.log_dir, remote)
        for name, cfg in self._configs.items():
            info = run._replace(resume_id=self._resume_ids.get(name))
            try:
                self._started[name] = instantiate(OmegaConf.structured(cfg), run=info, _convert_="all")
            except InstantiationException as wrapped:
                # Hydra wraps what the logger raised in its own error ("Error in call to target ..."), which the
                # entry point would show as a traceback: an error the user can fix (a full disk: a StorageError)
                # is said as itself, as anywhere else in the run.
                cause = wrapped.__cause__
                if isinstance(cause, UserError):
                    raise cause from None
                if cause is not None and (refusal := write_refusal(cause)) is not None:  # in a library's own error
                    raise StorageError(f"logger.{name} could not write its files in {run.log_dir}: {refusal}"
                                       ) from cause
                raise

    def log(self, metrics: Mapping[str, float], *, step: int) -> None:
        for tracker in self._started.values():
            tracker.log(metrics, step=step)

    def log_final(self, metrics: Mapping[str, float], *, step: int) -> None:
        """The figures of a run's end: where a logger keeps rows an earlier attempt logged (``log_final``: the CSV
        logger), in their place; the others log them as any."""
        for tracker in self._started.values():
            getattr(tracker, "log_final", tracker.log)(metrics, step=step)

    def log_classes(self, analyses: Sequence["SplitAnalysis"], *, step: int) -> None:
        """The final evaluation's per-class figures and confusion matrices (nli.evaluate.per_class), to each logger that
        takes them (a ``log_classes`` method; one without has nowhere to put them)."""
        if not analyses:
            return
        for tracker in self._started.values():
            log_classes = getattr(tracker, "log_classes", None)
            if log_classes is not None:
                log_classes(analyses, step=step)

    def sync(self) -> None:
        """Everything logged so far onto disk (for loggers that buffer it), then copied to the bucket.
        A copy that fails is tried again at the next call: it never stops training."""
        for tracker in self._started.values():
            flush = getattr(tracker, "flush", None)
            if flush is not None:
                flush()
        if self._mirror is not None:
            try:
                self._mirror.sync()
            except OSError as error:  # fsspec's and gcsfs's errors are OSErrors
                log.warning("the loggers' files were not copied to %s (%s); trying again at the next checkpoint",
                            self._mirror.remote, error)

    def finish(self, summary: Mapping[str, Any]) -> None:
        for tracker in self._started.values():
            tracker.finish(summary)
        self.sync()

    def places(self) -> Dict[str, str]:
        """Where each started logger's records are (a file, a folder, a URL), for the run's last lines; a
        bucket folder where the files are copied there."""
        found = {name: str(where) for name, tracker in self._started.items()
                 if (where := getattr(tracker, "where", None)) is not None}
        if self._mirror is None:
            return found
        local = str(self._mirror.local).rstrip("/")
        return {name: where.replace(local, self._mirror.remote.rstrip("/"), 1) for name, where in found.items()}

    def state_dict(self) -> Dict[str, Any]:
        return {name: tracker.run_id for name, tracker in self._started.items()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        self._resume_ids = dict(state)


class LogMirror:
    """Copies the files of a local folder that are new or changed since the last call into a bucket
    folder (anything fsspec writes). Event files and logs only grow, so a copy is always whole."""

    def __init__(self, local: Path, remote: str) -> None:
        import fsspec

        self.local, self.remote = local, remote.rstrip("/")
        self._fs, self._root = fsspec.core.url_to_fs(self.remote)
        self._copied: Dict[Path, tuple[int, int]] = {}

    def sync(self) -> None:
        for path in sorted(self.local.rglob("*")):
            if not path.is_file() or path.is_symlink():
                continue
            stat = path.stat()
            if self._copied.get(path) != (stat.st_size, stat.st_mtime_ns):
                self._fs.put_file(str(path), f"{self._root}/{path.relative_to(self.local).as_posix()}")
                self._copied[path] = (stat.st_size, stat.st_mtime_ns)


def start(trackers: Trackers, context: RunContext, storage: Storage, *, resume_step: Optional[int] = None) -> None:
    """The run's loggers started under its name and group, writing their files where :func:`log_dirs` says.
    ``resume_step``: a training run's first step less one (:class:`RunInfo`); a training run (one with a
    ``resume_step``) exports its model to model/."""
    log_dir, remote = log_dirs(context, storage)
    model_dir = storage.describe(MODEL_DIR) if resume_step is not None else None
    trackers.start(RunInfo(name=context.run_name, group=context.group, config=context.resolved, log_dir=log_dir,
                           resume_id=None, overrides=context.overrides, resume_step=resume_step, model_dir=model_dir),
                   remote=remote)


def log_dirs(context: RunContext, storage: Storage) -> tuple[Path, Optional[str]]:
    """Where the loggers write their files (their writers need a local disk), and the bucket folder
    those files belong in, if any: the platform's log directory (Vertex AI's AIP_TENSORBOARD_LOG_DIR),
    else the output directory. Where that is local, they write there; else in the context's local
    folder (the Hydra run directory), or a temporary one, copied to the bucket at every checkpoint and
    at the end."""
    target = context.log_dir or storage.url
    if "://" not in target:
        return Path(target), None
    if context.local_dir is not None:
        return Path(context.local_dir), target
    return Path(tempfile.mkdtemp(prefix="nli-logs-")), target
