"""Where a run's examples and its model lie on this machine's disk, found from its config before anything loads.

A missing GLUE folder, file of your own or local checkpoint was found as it loaded: after the imports, about 8 s into
a run, and for a Slurm job after its wait in the queue. :func:`check` answers from the config alone (no ``datasets``,
no file read), with the messages the loading itself gives (nli.data.sources and nli.model.build read their paths
here), so the command line (nli.config.command) refuses such a run, or a sweep's job, in a fraction of a second,
before Hydra makes a folder, and a search's sweeper a trial drawn with such data (nli.sweep.search). A bucket's paths
(``gs://``) are the loading's to check: that needs the network. A process of a run on several machines leaves its
paths to the run (nli.cli), whose processes stop together where one machine lacks its data (nli.recipe.load_data).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import List, Optional, Sequence

from omegaconf import DictConfig, OmegaConf, open_dict
from omegaconf.errors import OmegaConfBaseException

from nli.config.keys import built
from nli.config.schema import Config, DataConfig, GlueFilesConfig, TaskConfig, task_config
from nli.errors import ConfigError, DataError, UserError

GLUE_HUB = "nyu-mll/glue"  # the GLUE tasks' Hub dataset
SLURM_LAUNCHER = "submitit_slurm"  # hydra-submitit-launcher's: the jobs run on a cluster's nodes
# The launchers whose jobs run on Google's machines: a local path of such a job is of its container (/gcs/<bucket>/).
VERTEX_LAUNCHERS = ("vertex", "vertex-spot")
# How a sweep's jobs' paths are looked for here (:func:`how_checked`).
REFUSE, WARN, SKIP = "refuse", "warn", "skip"
# The formats data.files reads, by extension (nli.data.sources.FILE_FORMATS reads each).
FILE_SUFFIXES = (".csv", ".json", ".jsonl", ".parquet", ".tsv")


def check(cfg: Config) -> None:
    """Stop with the loading's own error where a local folder or file the run ``cfg`` reads is not there: its model
    (a path meant as a local checkpoint: :func:`local_model`), its data.files, its task's files in data.dir, and
    eval.dir's files of each set of eval.extra."""
    if cfg.model.name_or_path and "://" not in cfg.model.name_or_path:  # a bucket's: copied as the run starts
        local_model(cfg.model.name_or_path, cfg.model.revision)
    _check_source(cfg.task, cfg.data, run_splits(cfg), "data.dir")
    if cfg.eval.dir is not None and "://" not in cfg.eval.dir:
        source = DataConfig(dir=cfg.eval.dir)
        for name in cfg.eval.tasks():  # an extra set is scored on its eval splits alone (nli.evaluate.evalsets)
            task = task_config(name)
            if task.glue is not None:
                _check_source(task, source, list(task.eval_splits), "eval.dir")


def how_checked(sweep: DictConfig) -> str:
    """How the paths of the jobs of ``sweep`` (a config with its ``hydra`` node) are looked for on this machine:
    :data:`REFUSE` a job whose data is missing, where its launcher runs it here; only :data:`WARN` of it on Slurm, whose
    nodes see the shared disks of the login node and may have more (a node's own); :data:`SKIP` where the jobs run on
    Vertex AI, whose local paths are of its containers, or where Hydra changes into each job's folder
    (``hydra.job.chdir``), of which a relative path is."""
    launcher = str(OmegaConf.select(sweep, "hydra.runtime.choices", default={}).get("hydra/launcher", "basic"))
    if OmegaConf.select(sweep, "hydra.job.chdir") or launcher in VERTEX_LAUNCHERS:
        return SKIP
    return WARN if launcher == SLURM_LAUNCHER else REFUSE


def trial_refusal(cfg: DictConfig) -> Optional[str]:
    """Why a search's trial (its composed config, ``hydra`` node included), drawn as the search goes, would stop as it
    starts for want of its data or its local model (:func:`check`), where it runs on this machine; None where they are
    there, are looked for elsewhere, or where its config is another's to refuse (nli.config.schema.job_refusal)."""
    if how_checked(cfg) != REFUSE or OmegaConf.get_type(cfg) is not Config:
        return None
    plain = copy.deepcopy(cfg)
    with open_dict(plain):
        plain.pop("hydra", None)
    try:
        config = built(plain)
    except (UserError, OmegaConfBaseException):  # the rules refuse it: job_refusal says why
        return None
    try:
        check(config)
    except UserError as err:
        return str(err)
    return None


def run_splits(cfg: Config) -> List[str]:
    """The splits of its task the run ``cfg`` reads: the training split unless it only evaluates, the eval splits,
    and the test splits where it predicts them."""
    task = cfg.task
    return [*([] if cfg.eval.only else [task.train_split]), *task.eval_splits,
            *(task.test_splits if cfg.train.predict else [])]


def _check_source(task: TaskConfig, data: DataConfig, splits: List[str], key: str) -> None:
    if data.files:  # they win over data.dir, as the loading reads them (nli.data.sources.load)
        for split in splits:
            own_file(data.files[split])
    elif data.dir is not None and "://" not in data.dir and task.glue is not None:
        for split in splits:
            glue_file(task, task.glue, data.dir, split, key, splits)


def local_model(name_or_path: str, revision: str = "main") -> bool:
    """Whether model.name_or_path ``name_or_path`` is a local checkpoint, a folder here (else a Hub id);
    :class:`ConfigError` where it is a path meant as one (absolute, ``./``, ``~``, or deeper than a Hub id's
    ``owner/name``) and no folder is there, or a folder and ``revision`` (model.revision) is not the default."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if revision != "main":  # a folder is read as it is: the revision would be recorded, never read
            raise ConfigError(f"model.revision={revision} picks a branch, tag or commit of a Hub id, and "
                              f"model.name_or_path={name_or_path} is a local folder, read as it is: drop "
                              "model.revision, or give the Hub id")
        return True
    if name_or_path.startswith(("/", ".", "~")) or name_or_path.count("/") > 1:
        where = "" if path.is_absolute() else f" (looked for from {Path.cwd()})"
        raise ConfigError(f"model.name_or_path={name_or_path} is not a directory{where}; give a local checkpoint "
                          "directory or a Hub id such as FacebookAI/roberta-base")
    return False


def own_file(name: str) -> Optional[Path]:
    """data.files' file ``name``, local (None for a bucket's); :class:`DataError` where its format is not one the
    loading reads, or where it is not there."""
    if Path(name).suffix not in FILE_SUFFIXES:
        raise DataError(f"data.files: {name} is not one of the formats {sorted(FILE_SUFFIXES)}")
    if "://" in name:  # a bucket's: looked for as it is fetched (nli.io.remote)
        return None
    path = Path(name).expanduser()
    if not path.is_file():
        raise DataError(f"data.files: {_not_there(path)}")
    return path


def _not_there(path: Path) -> str:
    """``path`` does not exist, said with the working directory a relative path was looked for from."""
    return f"{path} does not exist" + ("" if path.is_absolute() else f" (looked for from {Path.cwd()})")


def glue_file(task: TaskConfig, glue: GlueFilesConfig, root: str, split: str, key: str,
              needed: Sequence[str]) -> Path:
    """The file of ``split`` in the local GLUE directory ``root`` (set by ``key``), as its download lays it out;
    :class:`DataError` where it is not there. ``needed``: every split the run reads from the folder, which the
    message lists."""
    folder = Path(root).expanduser() / glue.folder
    path = folder / glue.files[split]
    if path.is_file():
        return path
    where = _not_there(folder if not folder.is_dir() else path)
    inside = Path(root).expanduser() / glue.files[split]
    if not folder.is_dir() and inside.is_file():  # data.dir=glue_data/RTE: the task's folder, not the one above
        raise DataError(f"{key}={root}: {where}, and {inside} does: {key} names the folder that holds "
                        f"{glue.folder}/, not {glue.folder}/ itself. Set {key}="
                        f"{Path(root).expanduser().resolve().parent}")
    raise DataError(not_glue_dir(task, glue, root, where, key, needed))


def not_glue_dir(task: TaskConfig, glue: GlueFilesConfig, root: str, where: str, key: str,
                 needed: Sequence[str]) -> str:
    """Why ``root`` (set by ``key``) is not the GLUE directory the run needs (``where``), what it must hold and
    where else the task's data can come from."""
    # The files of the splits this run reads: an evaluation reads no training file (eval.dir's sets, eval.only).
    expected = ", ".join(sorted({glue.files[split] for split in needed}))
    hub = "eval.dir=null" if key == "eval.dir" else f"{key}=null"
    if task.hub_dataset == GLUE_HUB:  # says how to get the data too, as the other sets' message does
        return (f"{key}={root}: {where}. A GLUE directory holds one folder per task ({glue.folder}/ for "
                f"{task.name}) with the files {expected}, as the original GLUE download lays them out: put them "
                f"there, or set {hub} to load {task.name} from the Hub ({task.hub_dataset})")
    return (f"{key}={root}: {where}. {key} holds each set's original download, unpacked, in a folder of its "
            f"own ({glue.folder}/ for {task.name}, with the files {expected}): put them there, or set {hub} to "
            f"load {task.name} from the Hub ({task.hub_dataset})")
