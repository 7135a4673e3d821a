"""A sweep on Vertex AI: compose every job, submit, watch, collect.

Every job's config is composed (and so checked) before the first submission, so a typo in one
override costs nothing. Locally each job gets its sweep subdirectory as under Hydra's own launcher
(``.hydra/`` and a log of its states); remotely it writes to ``<staging_bucket>/<sweep>/<job number>``,
whose model directory (nli.contract.vertex_dirs) holds what the job reports."""

from __future__ import annotations

import copy
import functools
import logging
import os
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any, Deque, Dict, List, Optional, Sequence, Tuple, cast

from google.cloud.aiplatform_v1 import CreateCustomJobRequest, JobState
from hydra import version
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import CompactHydraException
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from nli import contract
from nli.config.schema import job_refusal
from nli.contract import HW_GROUP, RESULTS_FILE, VERTEX_MODEL_DIR, vertex_dirs
from nli.sweep import table as sweep

from . import _cost, _record, _spec
from ._build import Image, check_image, image_of_source
from ._checks import LaunchError, check_bucket, check_machines, check_secrets
from ._client import Vertex
from ._git import GitState, git_state
from ._images import executor_image
from ._logs import JobLogs
from ._package import build_sdist, upload
from .config import VertexLauncherConf

log = logging.getLogger(__name__)

ENDED = {JobState.JOB_STATE_SUCCEEDED, JobState.JOB_STATE_FAILED, JobState.JOB_STATE_CANCELLED,
         JobState.JOB_STATE_EXPIRED, JobState.JOB_STATE_PARTIALLY_SUCCEEDED}
MAX_POLL_FACTOR = 10  # polling slows down to poll_interval x this while nothing changes


class JobFailed(CompactHydraException):
    """A Vertex AI job that did not succeed; the JobReturn of a FAILED job holds it. Its message says
    all there is (Hydra prints it without the launcher's traceback)."""


@dataclass
class Job:
    num: int
    overrides: List[str]
    config: DictConfig  # the job's whole config, hydra node included
    output_dir: Path  # local: .hydra/ and the job's log
    remote_dir: str  # gs://: the job's base output directory
    request: Dict[str, Any] = field(default_factory=dict)
    name: str = ""  # the CustomJob's resource name, once submitted
    state: JobState = cast(JobState, JobState.JOB_STATE_UNSPECIFIED)  # proto-plus is untyped: members read as int
    error: str = ""
    refused: str = ""  # why the framework's rules refuse its config (nli.config.schema.job_refusal): not submitted
    quote: _cost.Quote = _cost.UNPRICED  # its price per hour (hydra.launcher.prices)
    gpus: int = 0  # GPUs on all its machines
    started: Optional[datetime] = None  # when Vertex AI started running it, and when it ended: its billed time
    finished: Optional[datetime] = None

    @property
    def label(self) -> str:
        return f"#{self.num} {' '.join(self.overrides)}".strip()

    def note(self, message: str) -> None:
        """A line in the sweep's log and in the job's own log file."""
        log.info("%s: %s", self.label, message)
        with open(self.output_dir / f"{self.config.hydra.job.name}.log", "a") as stream:
            stream.write(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] {message}\n")


class Sweep:
    """One launcher's sweep; Optuna and other sweepers call launch() once per batch, the Optuna sweeper once per
    trial from several threads at once (nli.sweep.slots): what every launch shares is prepared under a lock."""

    def __init__(self, settings: VertexLauncherConf, config: DictConfig, hydra_context: HydraContext) -> None:
        self.settings = settings
        self.config = config
        self.hydra_context = hydra_context
        self.name = settings.sweep_name or f"{config.hydra.job.name}-{time.strftime('%Y%m%d-%H%M%S')}"
        self.dir = Path(str(config.hydra.sweep.dir))
        self._vertex: Optional[Vertex] = None
        self._package_uri: Optional[str] = None
        self._image: Optional[Image] = None
        self._bucket_checked = False  # once per sweep, not per launch (the Optuna sweeper's trials)
        self.logs = JobLogs(settings)
        self.source = Path(str(config.hydra.runtime.cwd), settings.source_dir).resolve()
        self.git: Optional[GitState] = git_state(self.source)
        self._lock = threading.Lock()

    def model_dir(self, num: int) -> str:
        """Job ``num``'s model directory in the bucket, where it writes its results (Vertex AI's layout)."""
        return vertex_dirs(self._remote_dir(num))[VERTEX_MODEL_DIR]

    def _remote_dir(self, num: int) -> str:
        return f"{str(self.settings.staging_bucket).rstrip('/')}/{self.name}/{num}"

    @property
    def vertex(self) -> Vertex:
        if self._vertex is None:
            self._vertex = Vertex(self.settings)
        return self._vertex

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[JobReturn]:
        with self._lock:  # Hydra's config singleton while composing, the sdist and image built once
            composed = self._prepare(job_overrides, initial_job_idx)
        returns = {job.num: self._refused(job) for job in composed if job.refused}
        jobs = [job for job in composed if not job.refused]
        returns.update(zip([job.num for job in jobs], self._launch(jobs) if jobs else []))
        return [returns[job.num] for job in composed]

    def _launch(self, jobs: List[Job]) -> List[JobReturn]:
        log.info("Vertex AI sweep %s: %s", self.name, _cost.estimate([job.quote for job in jobs], self.settings))
        if self.settings.dry_run:
            return [self._dry_run(job) for job in jobs]
        log.info("Vertex AI sweep %s: %d jobs in %s (%s), outputs in %s/%s", self.name, len(jobs),
                 self.settings.project, self.settings.region, self.settings.staging_bucket, self.name)
        _record.planned(jobs, self.settings, ran=self._records())
        if not self.settings.wait:
            returns = [self._submitted(job) for job in jobs]
            log.info("Not waiting for them: python -m nli.cloud attach %s follows them and fills the sweep's table "
                     "(from anywhere: %s/%s); python -m nli.cloud cancel %s cancels them", self.dir,
                     str(self.settings.staging_bucket).rstrip("/"), self.name, self.dir)
            return returns
        Watcher(self.vertex, self.settings, self.logs).run(jobs)
        return [self._collect(job) for job in jobs]

    def _prepare(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> List[Job]:
        """Every job composed and checked, and its request made, before any is submitted."""
        self.dir.mkdir(parents=True, exist_ok=True)
        saved = HydraConfig.instance().cfg
        try:
            jobs = [self._compose(list(overrides), initial_job_idx + i) for i, overrides in enumerate(job_overrides)]
        finally:
            HydraConfig.instance().cfg = saved
        for job in jobs:  # a sweeper's job drawn after the command line's check: it would fail on its machine
            job.refused = job_refusal(_task_config(job.config)) or ""
        check_machines(self.settings, [job.config for job in jobs],
                       self.hydra_context.config_loader.get_group_options(HW_GROUP))
        check_secrets(self.settings, [job.config for job in jobs])
        if not (self.settings.dry_run or self._bucket_checked):  # before the sdist, the image's context or a job
            check_bucket(self.settings)
            self._bucket_checked = True
        if self.settings.python_package():  # the image the sdist's pins can run on, before anything is built
            self.settings = replace(self.settings, executor_image_uri=executor_image(
                self.settings, Path(str(self.config.hydra.runtime.cwd), self.settings.source_dir).resolve()))
        package_uri = self._package() if self.settings.python_package() else None
        image = self._image_to_run()
        for job in (job for job in jobs if not job.refused):
            job.request = self._request(job, package_uri, image)
            hw = _spec.machine(job.config, self.settings)
            job.quote, job.gpus = _cost.job_price(hw, self.settings), _cost.gpus(hw)
        return jobs

    def _compose(self, overrides: List[str], num: int) -> Job:
        """The job's config as Hydra's own launcher makes it, and its local directory."""
        config = self.hydra_context.config_loader.load_sweep_config(self.config, overrides)
        with open_dict(config.hydra.job):
            config.hydra.job.id = f"{self.name}-{num}"
            config.hydra.job.num = num
        HydraConfig.instance().set_config(config)
        output_dir = Path(str(config.hydra.sweep.dir)) / str(config.hydra.sweep.subdir)
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = str(output_dir.absolute())
        output_dir.mkdir(parents=True, exist_ok=True)
        if config.hydra.output_subdir is not None:
            hydra_dir = output_dir / str(config.hydra.output_subdir)
            hydra_dir.mkdir(parents=True, exist_ok=True)
            OmegaConf.save(_task_config(config), hydra_dir / "config.yaml")
            OmegaConf.save(OmegaConf.create({"hydra": config.hydra}), hydra_dir / "hydra.yaml")
            OmegaConf.save(config.hydra.overrides.task, hydra_dir / "overrides.yaml")
        return Job(num, overrides, config, output_dir, self._remote_dir(num))

    def _request(self, job: Job, package_uri: Optional[str], image: Image) -> Dict[str, Any]:
        # Relative to where the sweep started, as the image's WORKDIR stands in for it. A sweep folder outside it
        # goes by its own name there: the image's user can make folders under its WORKDIR only, and the job writes
        # nothing there but Hydra's files and its log (its results go to its model directory in the bucket).
        output = job.output_dir.absolute()
        run_dir = os.path.relpath(output, str(job.config.hydra.runtime.cwd))
        if run_dir.startswith(".."):
            run_dir = os.path.relpath(output, self.dir.absolute().parent)
        sweep_id = sweep.running_sweep(self.dir).get(sweep.SWEEP_ID)
        own = {_record.SWEEP_LABEL: str(sweep_id)} if sweep_id else {}  # attach finds a job the record lacks by it
        job_labels = {**own, **_provenance_labels(image, self.git), **self.settings.labels}
        return _spec.custom_job(
            settings=self.settings, cfg=job.config, name=_spec.display_name(self.name, job.num, job.overrides),
            job_labels=_spec.labels(self.name, job.num, job.overrides, job_labels),
            args=_spec.container_args(job.config, job.overrides, run_dir), output_dir=job.remote_dir,
            code=_spec.Code(package_uri, image.uri, self._provenance(image)))

    def _image_to_run(self) -> Image:
        """The image every job of the sweep runs, found (or built) once per sweep, before any job is submitted."""
        if self._image is None:
            if self.settings.python_package():
                self._image = Image(str(self.settings.executor_image_uri), None)  # resolved at start (_images)
            elif self.settings.build:
                self._image = image_of_source(self.settings, self.source, str(self.settings.staging_bucket))
            elif self.settings.dry_run:
                self._image = Image(str(self.settings.image_uri), None)
            else:
                self._image = check_image(self.settings)
            code = self.git.text() if self.git else f"{self.source} (not a git checkout: no commit recorded)"
            log.info("The jobs run %s, code from %s", self._image.text(), code)
        return self._image

    def _provenance(self, image: Image) -> Dict[str, str]:
        """What each job gets told it runs (as variables) and its row records: the image and the commit."""
        found = {contract.JOB_IMAGE: image.text()}  # with its digest where known
        if self.git:
            found.update(self.git.env())
        return found

    def _package(self) -> str:
        """Build the sdist once per sweep (kept in the sweep directory) and upload it, unless dry run."""
        if self._package_uri is None:
            sdist = build_sdist(self.source, self.dir / "code")
            self._package_uri = f"{str(self.settings.staging_bucket).rstrip('/')}/{self.name}/code/{sdist.name}"
            if not self.settings.dry_run:
                upload(sdist, self._package_uri)
        return self._package_uri

    def _records(self) -> Dict[str, Any]:
        """The sweep table's columns of what a job ran: its image (with the registry's digest) and commit."""
        image = self._image.text() if self._image else None
        return {"image": image, "git_commit": self.git.commit if self.git else None,
                "git_dirty": self.git.dirty if self.git else None}

    def _refused(self, job: Job) -> JobReturn:
        """A job its config's rules refuse: failed here, a row in the table, and no request sent (its machine would
        have started only for the job to stop as it began)."""
        error = JobFailed(f"not submitted to Vertex AI: the job would stop as it starts: {job.refused}")
        job.note(str(error))
        sweep.record(self.dir, sweep.job_row(num=job.num, overrides=job.overrides, output_dir=str(job.output_dir),
                                             state=JobStatus.FAILED.name, results=None, error=str(error),
                                             **sweep.running_sweep(self.dir), **self._records()))
        return _job_return(job, JobStatus.FAILED, error)

    def _dry_run(self, job: Job) -> JobReturn:
        parent = f"projects/{self.settings.project}/locations/{self.settings.region}"
        request = CreateCustomJobRequest(parent=parent, custom_job=job.request)
        path = self.dir / "custom_jobs" / f"{job.num}.json"
        path.parent.mkdir(exist_ok=True)
        text = CreateCustomJobRequest.to_json(request, use_integers_for_enums=False,
                                              always_print_fields_with_no_presence=False)
        path.write_text(text + "\n")
        job.note(f"dry run: request written to {path}, nothing submitted")
        return _job_return(job, JobStatus.COMPLETED, None)  # Hydra's sweepers accept no other status here

    def _submitted(self, job: Job) -> JobReturn:
        job.name = self.vertex.create(job.request).name
        _record.submitted(job, self.settings)  # for python -m nli.cloud attach, cancel and logs
        job.note(f"submitted {job.name} (not waiting): {self.vertex.console_url(job.name)}")
        _note_tensorboard(job, self.settings)
        return _job_return(job, JobStatus.COMPLETED, None)  # no result yet: the job has only started

    def _collect(self, job: Job) -> JobReturn:
        """Hydra's JobReturn from what the job left in its output directory, and the job's row in the
        sweep's table (nli.sweep.table: the same table as under every launcher)."""
        # The row's stamp: the sweep's, and what the jobs ran (image, commit; attach reads them from the record).
        row, value, error = ended(job, {**sweep.running_sweep(self.dir), **self._records()})
        if error is None:
            job.note(f"return value {value!r}")
            sweep.record(self.dir, row)
            return _job_return(job, JobStatus.COMPLETED, value)
        job.note(str(error))
        if job.name and self.settings.failed_log_lines > 0:
            lines = self.logs.last_lines(job.name, self.settings.failed_log_lines)
            if lines:
                job.note(f"the last {len(lines)} lines of its output (Cloud Logging):\n" +
                         "\n".join(f"    {line}" for line in lines))
        sweep.record(self.dir, row)
        return _job_return(job, JobStatus.FAILED, error)


def ended(job: Job, stamp: Dict[str, Any]) -> Tuple[Dict[str, Any], Any, Optional[JobFailed]]:
    """An ended job's row in the sweep's table (nli.sweep.table, stamped with ``stamp``), from what it left in its
    output directory; its return value; and, where it did not succeed, its error. The launcher that waits
    and ``python -m nli.cloud attach`` both fill the table with it."""
    model_dir = vertex_dirs(job.remote_dir)[VERTEX_MODEL_DIR]  # where the job wrote, as Vertex AI told it
    reported = _own_report(sweep.read_json(f"{model_dir}/{_spec.JOB_RETURN_FILE}") or {}, job.name)
    row = functools.partial(sweep.job_row, num=job.num, overrides=job.overrides, output_dir=model_dir,
                            vertex_job=job.name, vertex_state=job.state.name, **stamp,
                            **_cost.row_columns(job.quote, job.gpus, job.started, job.finished))
    if job.state is JobState.JOB_STATE_SUCCEEDED:
        results = sweep.read_json(f"{model_dir}/{RESULTS_FILE}")
        value = reported.get("return_value", (results or {}).get("objective"))
        return row(state=JobStatus.COMPLETED.name, results=sweep.own_results(results, value, model_dir)), value, None
    reason = f"; the job reported {reported['error']}" if "error" in reported else ""
    error = JobFailed(f"Vertex AI job {job.label} ({job.name}) ended {job.state.name}: {job.error}{reason}")
    # No results: a job refused its folder (another run's) must not be shown with that run's results.
    return row(state=JobStatus.FAILED.name, results=None, error=str(error)), None, error


def _own_report(reported: Dict[str, Any], name: str) -> Dict[str, Any]:
    """The job's report, or {} where the folder holds another job's: one that ran earlier under the same sweep
    name and number, and died or was stopped before it could report (a report of no ID: an older image's)."""
    by = reported.get(_spec.REPORTED_BY)
    return reported if by is None or by == name.rsplit("/", 1)[-1] else {}


class Watcher:
    """Submits up to max_concurrent_jobs at a time and polls until every job has ended."""

    def __init__(self, vertex: Vertex, settings: VertexLauncherConf, logs: JobLogs) -> None:
        self.vertex = vertex
        self.settings = settings
        self.logs = logs
        self.counts: Counter[str] = Counter()

    def run(self, jobs: List[Job]) -> None:
        waiting: Deque[Job] = deque(jobs)
        active: List[Job] = []
        interval = self.settings.poll_interval
        try:
            while waiting or active:
                while waiting and len(active) < self.settings.max_concurrent_jobs:
                    active.append(self._submit(waiting.popleft()))
                changed = [job for job in active if self._poll(job)]
                if self.settings.stream_logs and self._stream(active):  # those that ended too: their last lines
                    changed.extend(active)  # new output: look again soon
                active = [job for job in active if job.state not in ENDED]
                self._count(jobs)
                if active or waiting:
                    interval = self.settings.poll_interval if changed else min(
                        interval * 1.5, self.settings.poll_interval * MAX_POLL_FACTOR)
                    time.sleep(interval)
            if self.settings.stream_logs:
                self._stream(jobs)  # what reached Cloud Logging after the last look
        except KeyboardInterrupt:
            self._cancel([job for job in jobs if job.name and job.state not in ENDED])
            raise SystemExit(130) from None
        except LaunchError as error:
            running = [job for job in jobs if job.name and job.state not in ENDED]
            raise LaunchError(f"{error}{_still_running(running, self.settings.region)}") from None

    def _stream(self, jobs: List[Job]) -> bool:
        """Prints the jobs' output logged since the last look, each line after its job; whether there was any."""
        by_name = {job.name: job for job in jobs if job.name}
        found = self.logs.new_lines(list(by_name))
        for name, lines in found.items():
            for line in lines:
                log.info("%s | %s", by_name[name].label, line)
        return any(found.values())

    def _submit(self, job: Job) -> Job:
        created = self.vertex.create(job.request)
        job.name, job.state = created.name, JobState(created.state)
        _record.submitted(job, self.settings)  # for python -m nli.cloud attach, cancel and logs
        job.note(f"submitted {job.name}: {self.vertex.console_url(job.name)}")
        _note_tensorboard(job, self.settings)
        return job

    def _poll(self, job: Job) -> bool:
        remote = self.vertex.get(job.name)
        state = JobState(remote.state)
        if state == job.state:
            return False
        job.state, job.error = state, remote.error.message
        job.started, job.finished = remote.start_time or None, remote.end_time or None  # unset: None
        job.note(f"{state.name} {self.vertex.console_url(job.name)}")
        return True

    def _count(self, jobs: List[Job]) -> None:
        counts = Counter(_phase(job.state) for job in jobs)
        if counts != self.counts:
            self.counts = counts
            log.info("Vertex AI: %s", " · ".join(f"{counts[phase]} {phase}" for phase in
                                                   ("pending", "running", "succeeded", "failed")))

    def _cancel(self, jobs: List[Job]) -> None:
        log.warning("Interrupted: cancelling the %d jobs this sweep started and has not seen end", len(jobs))
        for job in jobs:
            try:
                self.vertex.cancel(job.name)
                job.note(f"cancelled {job.name}")
            except LaunchError as error:  # one job's cancel failing must not stop the others'
                job.note(f"could not cancel {job.name}: {error}")


def _provenance_labels(image: Image, git: Optional[GitState]) -> Dict[str, str]:
    """Labels to find a sweep's jobs by code in the console and billing: the image's tag and the commit
    (a label holds no `/` or `:`, so not the whole image; the job's NLI_IMAGE_URI has it)."""
    tag = image.uri.rsplit("@", 1)[0].rsplit("/", 1)[-1].partition(":")[2]
    found = {"image_tag": tag} if tag else {}
    if git:
        found.update(git_commit=git.commit, git_dirty=str(git.dirty).lower())
    return found


def _note_tensorboard(job: Job, settings: VertexLauncherConf) -> None:
    if settings.tensorboard:
        job.note(f"TensorBoard: {_spec.tensorboard_url(settings.tensorboard, job.name)}")


def _phase(state: JobState) -> str:
    if state is JobState.JOB_STATE_SUCCEEDED:
        return "succeeded"
    if state in ENDED:
        return "failed"
    return "running" if state is JobState.JOB_STATE_RUNNING else "pending"


def _still_running(jobs: List[Job], region: str) -> str:
    if not jobs:
        return ""
    lines = "\n".join(f"  {job.label}: gcloud ai custom-jobs cancel {job.name.rsplit('/', 1)[-1]} --region={region}"
                      for job in jobs)
    return f"\nThese jobs of the sweep were already submitted and keep running:\n{lines}"


def _task_config(config: DictConfig) -> DictConfig:
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def _job_return(job: Job, status: JobStatus, value: Any) -> JobReturn:
    """As Hydra's run_job fills it in, with the value the remote run produced."""
    chdir = job.config.hydra.job.chdir
    if chdir is None:
        chdir = not version.base_at_least("1.2")
    return JobReturn(overrides=list(job.overrides), cfg=_task_config(job.config),
                     hydra_cfg=OmegaConf.create({"hydra": job.config.hydra}),
                     working_dir=str(job.output_dir) if chdir else os.getcwd(),
                     task_name=str(job.config.hydra.job.name), status=status, _return_value=value)

