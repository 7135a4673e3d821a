"""A local parallel sweep with its own GPU (or ``hw.gpus_per_node`` GPUs) per job: ``hydra/launcher=local-gpus``.

The preset (conf/hydra/launcher/local-gpus.yaml) runs the sweep under Hydra's joblib launcher with one
worker process per GPU slot (``n_jobs: ${nli.gpu_slots:${hw.gpus_per_node}}``: the GPUs the sweep's
process sees, divided by the GPUs per job), and tells every job to take a slot (``hydra.job.env_set``:
``NLI_LOCAL_GPUS=1``). The jobs beyond the slots wait in joblib's queue for a worker.

joblib's workers are processes that run one job after another, and CUDA reads ``CUDA_VISIBLE_DEVICES``
once per process, so a slot belongs to a worker for its life: the worker's first job, before anything
touches CUDA (nli.sweep.SweepResults.on_job_start, before the task function), takes a free slot by
holding an OS lock on ``<sweep dir>/.gpu_slots/<i>.lock`` and sets ``CUDA_VISIBLE_DEVICES`` to the slot's
devices; its later jobs keep them. The OS lets go of the lock when the process ends, however it ends
(a sweep stopped by Ctrl-C, SIGTERM or SIGKILL blocks no later sweep; the files may stay). A worker
whose sweep process is gone (SIGTERM or SIGKILL of it alone) would go on holding its GPUs, idle, for
minutes: it stops its job as SIGTERM stops a run (checkpoint written) and ends.

Slot ``i`` is devices ``[i*g, (i+1)*g)`` of those the sweep's process sees: ``CUDA_VISIBLE_DEVICES`` where
it is set (indices or UUIDs, as CUDA reads them), else every GPU NVML counts. Counted without CUDA
(and without torch): the sweep's process must not initialise CUDA before its workers start.

Light on purpose (no torch): nli.sweep.table imports it, and Hydra instantiates that callback before any job.
"""

from __future__ import annotations

import ctypes
import fcntl
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import List, Mapping, Optional, Sequence

from omegaconf import DictConfig, OmegaConf

from nli.contract import PREEMPTED

log = logging.getLogger(__name__)

MARKER = "NLI_LOCAL_GPUS"  # set in each job by the preset's hydra.job.env_set: take a GPU slot
RESOLVER = "nli.gpu_slots"
SLOTS_DIR = ".gpu_slots"
VISIBLE = "CUDA_VISIBLE_DEVICES"
_WAIT = 1.0  # seconds between looks for a free slot


def visible_gpus(environ: Mapping[str, str] = os.environ) -> List[str]:
    """The GPUs this process may use, as ``CUDA_VISIBLE_DEVICES`` names them: its entries where it is set
    (CUDA stops at the first empty or negative one), else ``0 .. n-1`` for the n GPUs NVML counts."""
    if VISIBLE in environ:
        devices: List[str] = []
        for entry in (part.strip() for part in environ[VISIBLE].split(",")):
            if not entry or entry.startswith("-"):
                break
            devices.append(entry)
        return devices
    return [str(index) for index in range(_nvml_count())]


def _nvml_count() -> int:
    """The machine's NVIDIA GPUs as the driver's management library counts them (what torch.cuda.device_count
    asks before CUDA starts); 0 where there is no driver."""
    try:
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
    except OSError:
        return 0
    count = ctypes.c_uint(0)
    if nvml.nvmlInit_v2() != 0:
        return 0
    try:
        return int(count.value) if nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)) == 0 else 0
    finally:
        nvml.nvmlShutdown()


def per_job(gpus_per_node: object) -> int:
    """The GPUs a job takes: ``hw.gpus_per_node``, at least one (hw=auto and hw=cpu say 0)."""
    return max(1, int(str(gpus_per_node or 0)))


def slots(gpus_per_node: object) -> int:
    """The preset's ``n_jobs``: how many jobs run at once, one per slot of :func:`per_job` GPUs; one (jobs
    one at a time) where this process sees fewer GPUs than a job takes."""
    return max(1, len(visible_gpus()) // per_job(gpus_per_node))


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, slots)


def refusal(config: DictConfig) -> Optional[str]:
    """Where the sweep is started: why a sweep under the preset cannot give each job its own GPUs, or None
    (also None for any other sweep). A worker beyond the slots would wait for ever for a slot that the
    others hold for their lives, so ``hydra.launcher.n_jobs`` may not exceed them."""
    if OmegaConf.select(config, f"hydra.job.env_set.{MARKER}", default=None) is None:
        return None
    wanted = OmegaConf.select(config, "hw.gpus_per_node", default=0)
    gpus, seen = per_job(wanted), visible_gpus()
    where = f"{VISIBLE}={os.environ[VISIBLE]}" if VISIBLE in os.environ else "NVML"
    if gpus > 1 and len(seen) < gpus:
        return (f"hw.gpus_per_node={gpus} GPUs per job, but this machine shows {len(seen)} ({where}): "
                "pick an hw with fewer GPUs per job, or run on a machine with more")
    count = slots(wanted)
    n_jobs = int(OmegaConf.select(config, "hydra.launcher.n_jobs", default=count))
    if not 1 <= n_jobs <= count:
        return (f"hydra.launcher.n_jobs={n_jobs}, but hydra/launcher=local-gpus has {count} GPU slot(s) of {gpus} "
                f"GPU(s) ({len(seen)} seen, {where}): leave n_jobs to the preset, or set it between 1 and {count}")
    if seen:
        log.info("local-gpus: %d job(s) at once, each on %d of the GPUs %s (%s)", n_jobs, gpus, ",".join(seen), where)
    else:
        log.info("local-gpus: no GPU seen (%s): the jobs run on the CPU, one at a time", where)
    return None


# ----------------------------------------------------------------------------- a worker's slot


@dataclass(frozen=True)
class Lease:
    """The slot a worker process holds in a sweep directory, and the devices it gives the process's jobs."""

    directory: Path
    slot: int
    slots: int
    devices: Sequence[str]
    fd: int  # the open lock file: the OS holds the lock while it is open

    @property
    def visible(self) -> str:
        return ",".join(self.devices)


_LEASE: List[Lease] = []  # this process's slot: the first job's, for every later job (CUDA reads the devices once)
_SEEN: List[List[str]] = []  # the devices the process saw before its first lease changed CUDA_VISIBLE_DEVICES


def lease(sweep_dir: Path, gpus_per_node: object, *, worker: bool) -> Optional[Lease]:
    """The job's GPUs under the preset: this process's slot in ``sweep_dir``, taken at its first job (waiting,
    if every slot is held, for one to free), with ``CUDA_VISIBLE_DEVICES`` set to its devices. None where
    the job is not under the preset, or no GPU is seen (the jobs run on the CPU). ``worker``: the job runs in
    a process the sweep's process started, which ends with it."""
    if MARKER not in os.environ:
        return None
    if not _SEEN:
        _SEEN.append(visible_gpus())
    gpus, seen = per_job(gpus_per_node), _SEEN[0]
    count = len(seen) // gpus
    if count == 0:
        log.info("local-gpus: no GPU seen (%d asked per job): this job runs on the CPU", gpus)
        return None
    if _LEASE and _LEASE[0].directory == sweep_dir.absolute():
        held = _LEASE[0]
    elif _LEASE:  # a worker that ran another sweep's jobs: its devices are fixed, it takes the same slot here
        taken = _take(sweep_dir, [_LEASE[0].slot], count, _LEASE[0].devices, wait=False)
        if taken is not None:
            os.close(_LEASE[0].fd)  # the earlier sweep's slot, let go: a sweep there again must not wait on it
            _LEASE[0] = taken
        held = _LEASE[0]
    else:
        taken = _take(sweep_dir, list(range(count)), count, seen, gpus=gpus, wait=True)
        assert taken is not None  # waited for one
        held = taken
        _LEASE.append(held)
        if worker:
            threading.Thread(target=_end_with, args=(os.getppid(),), name="gpu-slot-parent", daemon=True).start()
    os.environ[VISIBLE] = held.visible
    log.info("local-gpus: GPU slot %d of %d, %s=%s (process %d)", held.slot, held.slots, VISIBLE, held.visible,
             os.getpid())
    return held


def _take(sweep_dir: Path, candidates: Sequence[int], count: int, seen: Sequence[str], *, gpus: int = 0,
          wait: bool) -> Optional[Lease]:
    """The first free slot of ``candidates``, locked; waits for one where ``wait`` (else None, warned)."""
    folder = sweep_dir.absolute() / SLOTS_DIR
    folder.mkdir(parents=True, exist_ok=True)
    told = False
    while True:
        for slot in candidates:
            devices = list(seen[slot * gpus:(slot + 1) * gpus]) if gpus else list(seen)
            fd = _lock(folder / f"{slot}.lock", devices)
            if fd is not None:
                return Lease(sweep_dir.absolute(), slot, count, devices, fd)
        if not wait:
            log.warning("local-gpus: GPU slot %s in %s is held by another process (%s); this worker keeps "
                        "%s=%s from its earlier sweep", candidates, folder, _holders(folder, candidates), VISIBLE,
                        ",".join(seen))
            return None
        if not told:
            log.info("local-gpus: every GPU slot in %s is held (%s); waiting for one to free", folder,
                     _holders(folder, candidates))
            told = True
        time.sleep(_WAIT)


def _lock(path: Path, devices: Sequence[str]) -> Optional[int]:
    """The open file, locked by this process (its pid and devices written in it, for whoever waits); None if
    another process holds it. Not inherited across exec: only this process and its forks hold it."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"pid {os.getpid()} {VISIBLE}={','.join(devices)}\n".encode(), 0)
    return fd


def _holders(folder: Path, slots: Sequence[int]) -> str:
    said = []
    for slot in slots:
        try:
            said.append(f"slot {slot}: {(folder / f'{slot}.lock').read_text().strip()}")
        except OSError:
            continue
    return "; ".join(said) or "by processes that wrote nothing yet"


def _end_with(parent: int) -> None:
    """A worker's watch on the sweep's process: once it is gone, the job running here is stopped as SIGTERM
    stops a run (nli.runtime.signals: checkpoint written, resumable), and the worker ends as soon as no job holds
    SIGTERM, which lets its slot go. Between jobs SIGTERM ends the worker at once."""
    while os.getppid() == parent:
        time.sleep(_WAIT)
    log.warning("local-gpus: the sweep's process %d is gone: this worker (process %d) stops its job and ends",
                parent, os.getpid())
    os.kill(os.getpid(), signal.SIGTERM)
    while signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None):  # a job writing its checkpoint
        time.sleep(_WAIT / 4)
    os._exit(PREEMPTED)
