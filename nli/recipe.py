"""One fine-tuning run, in named phases that read top to bottom:

    setup -> data -> model -> optimization -> fit -> export -> report

Each phase takes the config and what the phases before it made, and hands on a small typed value.
A run is resumable: its output directory (local or gs://) holds checkpoints; started again with
the same output directory, it continues from the newest intact checkpoint and ends exactly where an
uninterrupted run would. A run that already finished reports its results again.
"""

from __future__ import annotations

import json
import logging
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Optional, cast

import datasets
import torch
import transformers
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, set_seed

from nli import contract, data, device, distributed, fastpaths, platform
from nli.checkpoint import (
    BestEvaluation,
    Checkpointer,
    Checkpoints,
    Progress,
    RandomState,
    Snapshot,
    TrainingState,
    seed_rank,
)
from nli.config import Config
from nli.distributed import World
from nli.errors import CheckpointError, ConfigError
from nli.evaluation import Evaluator, gather, predict
from nli.hooks import EarlyStopping, Hook, MetricsLog, ProgressBar
from nli.loop import Loop, Optimization, Plan, TrainResult
from nli.model import build_model, build_tokenizer, load_export, save_pretrained, share_tokenizer, tokenizer_from_files
from nli.optim import build_optimizer, build_scheduler
from nli.predictions import submission
from nli.signals import Preempted, StopRequest
from nli.storage import Storage
from nli.tracking import RunInfo, Trackers

log = logging.getLogger(__name__)


@dataclass
class Outputs:
    """Where the run writes, and what an earlier attempt of it left there."""

    storage: Storage  # the output directory
    checkpoints: Checkpoints
    site: platform.Site
    world: World
    snapshot: Optional[Snapshot]  # the newest intact checkpoint, when resuming
    finished: Optional[Dict[str, Any]]  # results.json, when the run already finished


@dataclass
class Data:
    tokenizer: PreTrainedTokenizerBase
    train: DataLoader  # this rank's micro-batches of each global batch
    sampler: data.EpochSampler  # the order of each epoch
    evaluate: Evaluator  # the eval splits' metrics
    test: Dict[str, DataLoader]  # test split -> this rank's slice, when predicting
    examples_per_epoch: int


@dataclass
class Training:
    opt: Optimization
    plan: Plan
    state: TrainingState  # what a checkpoint holds
    progress: Progress
    best: BestEvaluation
    early_stopping: Optional[EarlyStopping]
    trackers: Trackers


def run(cfg: Config, raw: DictConfig) -> Dict[str, Any]:
    """The whole run, in the same process on every rank; the results, as results.json holds them."""
    site = platform.detect()
    world = distributed.setup(site.process_env)
    try:
        out = setup(cfg, raw, world, site)
        if out.finished is not None:
            return out.finished
        compute = prepare(cfg, world)
        loaded = load_data(cfg, out, compute)
        model = build(cfg, loaded, compute, world)
        training = optimization(cfg, model, loaded, out, compute)
        result = fit(cfg, raw, training, loaded, out)
        best_model = export(model, training, loaded, out, result)
        return report(cfg, training, loaded, out, result, best_model)
    finally:
        distributed.teardown()


def setup(cfg: Config, raw: DictConfig, world: World, site: platform.Site) -> Outputs:
    """The world and the outputs: the output directory, its checkpoints, and whether this run has
    already finished (its results) or stopped part-way (the checkpoint to resume from)."""
    datasets.disable_progress_bars()  # one progress bar, the training loop's
    transformers.utils.logging.disable_progress_bar()
    if not world.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 tells the story; the others only warn
    cfg.check_batch(world.world_size)
    # Each process composed its own config; a Hydra run dir named by the clock may differ by a second.
    cfg.output_dir = world.gather(cfg.output_dir or site.output_dir or _hydra_run_dir())[0]
    cfg.train.checkpoint_dir = cfg.train.checkpoint_dir or site.checkpoint_dir
    storage = Storage(cfg.output_dir)
    if world.is_main:
        storage.check_writable()
    world.barrier()
    checkpoints = _checkpoints(cfg, storage)
    newest = checkpoints.newest_step()
    if newest is not None and not cfg.train.resume:
        raise CheckpointError(f"{checkpoints.where()} holds a checkpoint of step {newest} and train.resume=false "
                              "refuses to continue or overwrite it. Choose another output_dir (or hydra.run.dir) "
                              "to start afresh, delete that folder, or drop train.resume=false to continue")
    if newest is not None:
        checkpoints.check_identity(newest)
    out = Outputs(storage, checkpoints, site, world, snapshot=None, finished=_finished(storage))
    if out.finished is None:
        out.snapshot = checkpoints.latest() if cfg.train.resume else None
        if world.is_main:
            with open_dict(raw):  # the resolved directories, as the run uses them
                raw.output_dir, raw.train.checkpoint_dir = cfg.output_dir, cfg.train.checkpoint_dir
            storage.write_text(contract.CONFIG_FILE, OmegaConf.to_yaml(raw, resolve=True))
    return out


def prepare(cfg: Config, world: World) -> device.Compute:
    """The seed (the same on every rank: the same initial weights), the device and the precision."""
    set_seed(cfg.seed)
    compute = device.resolve(cfg.hw, cfg.precision)
    if cfg.hw.data_parallel_size > world.world_size and world.is_main:
        machines = f" on each of its {cfg.hw.nodes} machines" if cfg.hw.nodes > 1 else ""
        log.warning("hw has %d GPUs but this run uses %d process(es); gradient accumulation keeps the global batch "
                    "at %d. Start it with torchrun --nproc-per-node %d%s to use them all", cfg.hw.data_parallel_size,
                    world.world_size, cfg.train.batch_size, cfg.hw.gpus_per_node, machines)
    return compute


def load_data(cfg: Config, out: Outputs, compute: device.Compute) -> Data:
    """The task's splits, tokenized once, and their loaders. The tokenizer is the checkpoint's when
    resuming (one learnt from the training text must not change), else the model's."""
    world = out.world
    splits = data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=cfg.train.predict)
    tokenizer = (tokenizer_from_files(out.snapshot.tokenizer_files) if out.snapshot else
                 build_tokenizer(cfg.model, splits.train_texts(cfg.task.text_fields),
                                 max_seq_length=cfg.data.max_seq_length))
    tokenizer = share_tokenizer(tokenizer, world)
    splits = data.tokenize(splits, tokenizer, cfg.task, cfg.data.max_seq_length)
    pin = compute.device.type == "cuda"
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed, and leave a compiled model a
    # handful of shapes to compile for, not one per length; on the CPU they only add padding.
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if pin or cfg.train.compile else None)
    train, sampler = data.train_loader(splits.train, collator, batch_size=cfg.train.batch_size,
                                       micro_batch_size=cfg.micro_batch_size(world.world_size), seed=cfg.seed,
                                       world=world, num_workers=cfg.data.num_workers, pin_memory=pin,
                                       bucket=cfg.data.bucket)
    in_order = {name: data.eval_loader(ds, collator, batch_size=cfg.train.eval_batch_size, world=world,
                                       num_workers=cfg.data.num_workers, pin_memory=pin)
                for name, ds in {**splits.eval, **splits.test}.items()}
    evaluator = Evaluator({name: in_order[name] for name in splits.eval}, cfg.task, compute, world)
    return Data(tokenizer, train, sampler, evaluator, {name: in_order[name] for name in splits.test},
                examples_per_epoch=len(splits.train))


def build(cfg: Config, loaded: Data, compute: device.Compute, world: World) -> torch.nn.Module:
    """The model (pretrained or from scratch) on the device, with the fast paths that apply."""
    model = build_model(cfg.model, cfg.task, loaded.tokenizer).to(compute.device)
    fastpaths.install(model, device=compute.device, enabled=cfg.model.fast_paths, compiled=cfg.train.compile)
    seed_rank(cfg.seed, world)
    return model


def optimization(cfg: Config, model: torch.nn.Module, loaded: Data, out: Outputs,
                 compute: device.Compute) -> Training:
    """The plan, optimizer, schedule and loss scaler; the state a checkpoint holds, restored when
    resuming; then the model wrapped for data parallelism and compiled, if asked."""
    world = out.world
    accumulation = cfg.accumulation_steps(world.world_size)
    plan = Plan.make(cfg.train, examples_per_epoch=loaded.examples_per_epoch, world_size=world.world_size,
                     accumulation=accumulation)
    log.info("training: %d steps of %d examples (%d x %d accumulated%s)", plan.total_steps, cfg.train.batch_size,
             cfg.micro_batch_size(world.world_size), accumulation,
             f" x {world.world_size} processes" if world.distributed else "")
    optimizer = build_optimizer(cfg.optimizer, model)
    scheduler = build_scheduler(cfg.schedule, optimizer, plan.total_steps)
    scaler = torch.amp.GradScaler(compute.device.type, enabled=compute.dtype == torch.float16)
    progress, best, trackers = Progress(), BestEvaluation(), Trackers(cfg.logger, enabled=world.is_main)
    early = _early_stopping(cfg)
    state = TrainingState()
    for name, part in (("model", model), ("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler),
                       ("progress", progress), ("best", best)):
        state.register(name, part)
    state.register("trackers", trackers, optional=True)
    if early is not None:
        state.register("early_stopping", early, optional=True)
    state.register("rng", RandomState(world, progress))  # last: nothing restored after it draws from it
    if out.snapshot is not None:
        state.load_state_dict(out.snapshot.state)
        log.info("resuming from checkpoint %s: step %d of %d", out.checkpoints.where(out.snapshot.name),
                 progress.step, plan.total_steps)
    trained = distributed.wrap(model, world, compute.device)  # after the restore: DDP starts from rank 0's weights
    if cfg.train.compile:  # for training steps; evaluation runs the plain model
        trained = cast(torch.nn.Module, torch.compile(trained))  # an OptimizedModule, typed as any callable
    return Training(Optimization(model, trained, optimizer, scheduler, scaler, compute, world), plan, state,
                    progress, best, early, trackers)


def fit(cfg: Config, raw: DictConfig, training: Training, loaded: Data, out: Outputs) -> TrainResult:
    """Train to the end of the plan, or until a hook or a signal stops it (then the run ends with
    :class:`Preempted`, its checkpoint written)."""
    world = out.world
    training.trackers.start(RunInfo(name=_run_name(out.storage), group=_sweep_name(),
                                    config=cast(Dict[str, Any], OmegaConf.to_container(raw, resolve=True)),
                                    log_dir=_log_dir(out), resume_id=None))
    hooks: list[Hook] = [ProgressBar(total=training.plan.total_steps, initial=training.progress.step,
                                     enabled=cfg.train.progress_bar and world.is_main),
                         MetricsLog(training.trackers, main=world.is_main)]
    if training.early_stopping is not None:
        hooks.append(training.early_stopping)
    checkpointer = Checkpointer(out.checkpoints, training.state, loaded.tokenizer, world)
    loop = Loop(training.opt, loaded.train, loaded.sampler, training.plan, evaluate=loaded.evaluate,
                checkpointer=checkpointer, hooks=hooks)
    with StopRequest(requeue=out.site.requeue_signal) as stop:
        try:
            return loop.run(training.progress, training.best, stop)
        except Preempted:
            stop.hand_over()  # the checkpoint is written: the platform may requeue the job now
            raise


def export(model: torch.nn.Module, training: Training, loaded: Data, out: Outputs,
           result: TrainResult) -> torch.nn.Module:
    """The best checkpoint's weights, saved with their tokenizer as ``model/``; the model to evaluate
    is what was exported, read back (transformers' save_pretrained writes on rank 0 alone; the
    other ranks evaluate the same weights in memory)."""
    model.load_state_dict(out.checkpoints.load_model_weights(result.best.step))
    if not out.world.is_main:
        return model
    with tempfile.TemporaryDirectory() as folder:
        save_pretrained(model, loaded.tokenizer, Path(folder))
        out.storage.upload_dir(Path(folder), contract.MODEL_DIR)
        return load_export(Path(folder)).to(training.opt.compute.device)


def report(cfg: Config, training: Training, loaded: Data, out: Outputs, result: TrainResult,
           best_model: torch.nn.Module) -> Dict[str, Any]:
    """The exported model's evaluation and test predictions, and results.json, written last."""
    final = loaded.evaluate(best_model, result.best.step)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), exported to %s: %s",
             cfg.task.main_metric, result.best.step, result.steps, out.storage.describe(contract.MODEL_DIR),
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    for split, loader in loaded.test.items():
        predicted = gather(predict(best_model, loader, cfg.task, training.opt.compute), out.world)
        name, text = submission(cfg.task, split, predicted)
        if out.world.is_main:
            out.storage.write_text(f"{contract.PREDICTIONS_DIR}/{name}", text)
        log.info("test predictions for %s written to %s", split, out.storage.describe(contract.PREDICTIONS_DIR, name))
    early = training.early_stopping
    results = {"objective": final.objective, **final.metrics,
               "train_examples_per_second": result.examples_per_second,
               "train_tokens_per_second": result.tokens_per_second,
               "peak_memory_bytes": device.peak_memory_bytes(training.opt.compute.device),
               "train_seconds": result.seconds, "train_steps": result.steps, "best_step": result.best.step,
               "stopped_early": early.stopped_at if early else None, "status": "completed"}
    if out.world.is_main:
        out.storage.write_text(contract.RESULTS_FILE, json.dumps(results, indent=2) + "\n")  # last: the run is done
    training.trackers.finish(results)
    log.info("results: %s", json.dumps(results))
    out.world.barrier()  # no rank returns before the run's outputs are written
    return results


def _checkpoints(cfg: Config, storage: Storage) -> Checkpoints:
    """Checkpoints go to ``<output_dir>/checkpoints``, or to ``train.checkpoint_dir`` (or the
    platform's). Their identity is the model and task: another run's are not resumed."""
    folder = Storage(cfg.train.checkpoint_dir or storage.describe(contract.CHECKPOINTS_DIR))
    if cfg.train.checkpoint_dir:
        folder.check_writable()
    scratch = cfg.model.scratch
    model = cfg.model.name_or_path or (f"{scratch.model_type} from scratch, {scratch.num_hidden_layers} layers "
                                       f"of {scratch.hidden_size}" if scratch else "")
    return Checkpoints(folder, keep=cfg.train.keep_checkpoints, identity={"model": model, "task": cfg.task.name})


def _finished(storage: Storage) -> Optional[Dict[str, Any]]:
    if not storage.exists(contract.RESULTS_FILE):
        return None
    results = json.loads(storage.read_bytes(contract.RESULTS_FILE))
    log.info("this run already finished; its results, from %s: %s", storage.describe(contract.RESULTS_FILE),
             json.dumps(results))
    return results


def _early_stopping(cfg: Config) -> Optional[EarlyStopping]:
    stopping = cfg.train.early_stopping
    if stopping.patience is None:
        return None
    return EarlyStopping(patience=stopping.patience, min_delta=stopping.min_delta, metric=cfg.task.main_metric)


def _hydra_run_dir() -> str:
    if not HydraConfig.initialized():
        raise ConfigError("output_dir is not set and there is no Hydra run directory: set output_dir")
    return str(HydraConfig.get().runtime.output_dir)


def _log_dir(out: Outputs) -> Path:
    """Where the loggers write their files: the platform's log directory when it is local, else the
    output directory when it is local, else the Hydra run directory (their writers need a local disk)."""
    for candidate in (out.site.log_dir, out.storage.url):
        if candidate and "://" not in candidate:
            return Path(candidate)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(tempfile.mkdtemp(prefix="nli-logs-"))


def _run_name(storage: Storage) -> str:
    """The Hydra job's overrides (``optimizer.lr=1e-05,seed=2``), else its directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().job.override_dirname:
        return str(HydraConfig.get().job.override_dirname)
    return Path(storage.root).name


def _sweep_name() -> Optional[str]:
    """Jobs of one multirun share a group: the sweep directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return None
