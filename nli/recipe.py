"""One fine-tuning run, in named phases that read top to bottom:

    setup -> data -> model -> optimization -> fit -> export -> report

An evaluation-only run (``eval.only=true``) keeps setup and report, and in between loads the trained
model as it is, with its tokenizer, and the eval splits alone: no optimizer, no checkpoints, no
training set (:func:`evaluate_only`).

Each phase takes the config and what the phases before it made, and hands on a small typed value.
A run is resumable: its output directory (local or gs://) holds checkpoints; started again with
the same output directory, it continues from the newest intact checkpoint and ends exactly where an
uninterrupted run would. A run that already finished reports its results again.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, cast

import datasets
import numpy as np
import torch
import transformers
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, set_seed

from nli import contract, cpu, data, device, distributed, evalsets, export, fastpaths, lora, platform, sweep, xla
from nli.checkpoint import (
    BestEvaluation,
    Checkpointer,
    Checkpoints,
    Progress,
    RandomState,
    Snapshot,
    Stateful,
    TrainingState,
    seed_rank,
)
from nli.claim import Claim
from nli.config import Accelerator, Config, TaskConfig
from nli.distributed import World
from nli.errors import ConfigError
from nli.evaluation import Evaluation, Evaluator, gather, predict, relabel
from nli.folder import earlier_run
from nli.hooks import EarlyStopping, Hook, MetricsLog, ProgressBar, Revisit, SyncLogs
from nli.identity import digest, identity
from nli.loop import Loop, Optimization, Plan, TrainResult
from nli.model import (
    build_model,
    build_tokenizer,
    head_labels,
    load_export,
    load_trained,
    share_tokenizer,
    tokenizer_from_files,
    trained_model,
    unwrap,
)
from nli.optim import build_optimizer, build_scheduler
from nli.predictions import submission
from nli.signals import Interrupted, StopRequest
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
    identity: Dict[str, Any]  # what the run computes (nli.identity): kept with every checkpoint
    claim: Optional[Claim]  # rank 0's hold on the folder: checked before each write of the run's state
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
    extras: List[Evaluator]  # eval.extra's sets, scored at the end (nli.evalsets)


@dataclass
class Training:
    opt: Optimization
    plan: Plan
    state: TrainingState  # what a checkpoint holds
    weights: Stateful  # the model's part of it: every weight, or under LoRA the adapters and the head (nli.lora)
    progress: Progress
    best: BestEvaluation
    early_stopping: Optional[EarlyStopping]
    trackers: Trackers


def run(cfg: Config, raw: DictConfig, site: platform.Site, stop: StopRequest, sharing: cpu.Sharing) -> Dict[str, Any]:
    """The whole run, in the same process on every rank; the results, as results.json holds them.
    ``stop`` (nli.signals) stops it in any phase; ``Interrupted.stage`` says how far it had come;
    ``sharing`` (nli.cpu) sizes its CPU threads."""
    world = xla.setup() if cfg.hw.accelerator == Accelerator.xla else distributed.setup(site.process_env)
    stage = "starting"
    try:
        with ExitStack() as held:  # the output folder's claim, released however the run ends
            out = setup(cfg, raw, world, site, held)
            if out.finished is not None:
                return out.finished
            compute = prepare(cfg, world, sharing)
            if cfg.eval.only:  # a trained model, scored: no optimizer, no checkpoints, no training set
                stage = "evaluating"
                return evaluate_only(cfg, raw, out, compute, stop)
            loaded = load_data(cfg, out, compute)
            stop.check()  # a signal some library swallowed (nli.signals) stops the run between phases
            model = build(cfg, loaded, compute, world)
            training = optimization(cfg, model, loaded, out, compute)
            stop.check()
            stage = "training"
            result = fit(cfg, raw, training, loaded, out, stop, sharing)
            stage = "finishing"
            if stop.signal:  # it came with the last step: training is whole and checkpointed
                raise Interrupted(stop.signal)
            best_model = finish_export(model, training, loaded, out, result)
            return report(cfg, training, loaded, out, result, best_model)
    except Interrupted as stopped:
        stopped.stage = stage
        raise
    finally:
        distributed.teardown()


def setup(cfg: Config, raw: DictConfig, world: World, site: platform.Site, held: ExitStack) -> Outputs:
    """The world and the outputs: the output directory, claimed for this run (``held`` to its end),
    its checkpoints, and whether this run has already finished (its results) or stopped part-way (the
    checkpoint to resume from); a folder that holds another run is refused (nli.folder)."""
    datasets.disable_progress_bars()  # one progress bar, the training loop's
    transformers.utils.logging.disable_progress_bar()
    if not world.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 tells the story; the others only warn
    cfg.check_batch(world.world_size)
    # Each process composed its own config; a Hydra run dir named by the clock may differ by a second.
    cfg.output_dir = world.gather(cfg.output_dir or site.output_dir or _hydra_run_dir())[0]
    cfg.train.checkpoint_dir = cfg.train.checkpoint_dir or site.checkpoint_dir
    storage = Storage(cfg.output_dir)
    claim = None
    if world.is_main:
        storage.check_writable()
        claim = held.enter_context(Claim.take(storage))  # one run at a time in the folder
    world.barrier()
    ident = identity(cast(Dict[str, Any], OmegaConf.to_container(raw, resolve=True, enum_to_str=True)))
    checkpoints = _checkpoints(cfg, storage, ident)
    out = Outputs(storage, checkpoints, site, world, ident, claim, snapshot=None,
                  finished=earlier_run(cfg, ident, storage, checkpoints))
    if out.finished is None:
        Trackers(cfg.logger, enabled=world.is_main).check()  # e.g. W&B online without a key: before anything loads
        out.snapshot = _resume_point(checkpoints, storage) if cfg.train.resume and not cfg.eval.only else None
        if world.is_main:
            with open_dict(raw):  # the resolved directories, as the run uses them
                raw.output_dir, raw.train.checkpoint_dir = cfg.output_dir, cfg.train.checkpoint_dir
            storage.write_text(contract.CONFIG_FILE, OmegaConf.to_yaml(raw, resolve=True))
    return out


def prepare(cfg: Config, world: World, sharing: cpu.Sharing) -> device.Compute:
    """The seed (the same on every rank: the same initial weights), the CPU threads, the device and
    the precision; on the CPU, glibc's heap threshold where the config fixes it (nli.cpu)."""
    set_seed(cfg.seed)
    sharing.start()
    compute = device.resolve(cfg.hw, cfg.precision)
    if compute.device.type == "cpu" and (done := cpu.limit_heap(cfg.hw.cpu_mmap_threshold, os.environ)):
        log.info("%s", done)
    if cfg.hw.data_parallel_size > world.world_size and world.is_main:
        machines = f" on each of its {cfg.hw.nodes} machines" if cfg.hw.nodes > 1 else ""
        log.warning("hw has %d GPUs but this run uses %d process(es); gradient accumulation keeps the global batch "
                    "at %d. Start it with %s%s to use them all", cfg.hw.data_parallel_size, world.world_size,
                    cfg.train.batch_size, "python -m nli.xla" if cfg.hw.accelerator == Accelerator.xla else
                    f"torchrun --nproc-per-node {cfg.hw.gpus_per_node}", machines)
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
    # eval.extra's sets, loaded now: a missing file or labels the model's cannot match stop the run before training.
    collator = _collator(cfg, tokenizer, compute)
    extras = evalsets.extras(cfg, labels=cfg.task.label_names, model=f"the model of task={cfg.task.name}",
                             tokenizer=tokenizer, collator=collator, compute=compute, world=world)
    splits = data.tokenize(splits, tokenizer, cfg.task, cfg.data.max_seq_length)
    assert splits.train is not None
    pin = compute.device.type == "cuda"
    train, sampler = data.train_loader(splits.train, collator, batch_size=cfg.train.batch_size,
                                       micro_batch_size=cfg.micro_batch_size(world.world_size), seed=cfg.seed,
                                       world=world, num_workers=cfg.data.num_workers, pin_memory=pin,
                                       bucket=cfg.data.bucket)
    in_order = {name: data.eval_loader(ds, collator, batch_size=cfg.train.eval_batch_size, world=world,
                                       num_workers=cfg.data.num_workers, pin_memory=pin)
                for name, ds in {**splits.eval, **splits.test}.items()}
    evaluator = Evaluator({name: in_order[name] for name in splits.eval}, cfg.task, compute, world,
                          groups=splits.groups)
    return Data(tokenizer, train, sampler, evaluator, {name: in_order[name] for name in splits.test},
                examples_per_epoch=len(splits.train), extras=extras)


def _collator(cfg: Config, tokenizer: PreTrainedTokenizerBase, compute: device.Compute) -> data.Collator:
    if compute.device.type == "xla":  # a graph compiled per input shape: a few lengths, not one per batch
        return data.BucketPadding(tokenizer, cfg.data.max_seq_length)
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed, and leave a compiled model a
    # handful of shapes to compile for, not one per length; on the CPU they only add padding.
    pad = 8 if compute.device.type == "cuda" or cfg.train.compile else None
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad)


def build(cfg: Config, loaded: Data, compute: device.Compute, world: World) -> torch.nn.Module:
    """The model (pretrained or from scratch), with LoRA adapters if asked (nli.lora), on the device,
    with the fast paths that apply."""
    model = build_model(cfg.model, cfg.task, loaded.tokenizer)
    fast = cfg.model.fast_paths
    if cfg.train.gradient_checkpointing:
        # Non-reentrant: works under DDP (no unused-parameter hooks fired twice) and torch.compile, and
        # needs no gradient on its inputs, which LoRA's frozen embeddings would not give.
        model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        if fast:  # they replace the layers' forward, which checkpointing wraps
            log.info("fast paths: off, as train.gradient_checkpointing recomputes the stock layers")
            fast = False
    if cfg.model.peft is not None:
        trained: torch.nn.Module = lora.apply(model, cfg.model.peft)
    else:
        log.info("model: %s parameters, all of them train", f"{sum(p.numel() for p in model.parameters()):,}")
        trained = model
    trained = trained.to(compute.device)
    # On the transformers model inside peft's wrapper: the fast paths call each layer's Linear modules by
    # name, so LoRA's adapted ones run in them as they do in the stock forward.
    fastpaths.install(unwrap(trained), device=compute.device, enabled=fast, compiled=cfg.train.compile)
    seed_rank(cfg.seed, world)
    return trained


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
    weights = _weights(cfg, model)
    for name, part in (("model", weights), ("optimizer", optimizer), ("scheduler", scheduler), ("scaler", scaler),
                       ("progress", progress), ("best", best)):
        state.register(name, part)
    if cfg.model.peft is not None:  # the frozen weights are built again on resume: they must be the same
        source = (f"model.name_or_path={cfg.model.name_or_path}" if cfg.model.pretrained else
                  "the model from scratch (model.scratch and seed)")
        state.register("frozen", lora.FrozenWeights(model, source))
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
                    weights, progress, best, early, trackers)


def fit(cfg: Config, raw: DictConfig, training: Training, loaded: Data, out: Outputs, stop: StopRequest,
        sharing: cpu.Sharing) -> TrainResult:
    """Train to the end of the plan, or until a hook or a signal stops it (then the run ends with
    :class:`Preempted`, its checkpoint written)."""
    world = out.world
    _start_trackers(training.trackers, raw, out)
    hooks: list[Hook] = [ProgressBar(total=training.plan.total_steps, initial=training.progress.step,
                                     enabled=cfg.train.progress_bar and world.is_main),
                         MetricsLog(training.trackers, main=world.is_main), SyncLogs(training.trackers),
                         Revisit(sharing.revisit)]
    if training.early_stopping is not None:
        hooks.append(training.early_stopping)
    hooks.append(export.ExportBest(out.storage, training.opt.model, loaded.tokenizer, main=world.is_main))
    checkpointer = Checkpointer(out.checkpoints, training.state, loaded.tokenizer, world, out.claim)
    loop = Loop(training.opt, loaded.train, loaded.sampler, training.plan, evaluate=loaded.evaluate,
                checkpointer=checkpointer, hooks=hooks)
    with stop.at_step_boundaries():
        result = loop.run(training.progress, training.best, stop)
    if xla.in_use():  # a number that grows with the steps means shapes that change: each one compiles again
        log.info("XLA compiled %(xla_compilations)d graphs in %(xla_compile_seconds).1f s", xla.compilations())
    return result


def finish_export(model: torch.nn.Module, training: Training, loaded: Data, out: Outputs,
                  result: TrainResult) -> torch.nn.Module:
    """The best checkpoint's weights (nli.export.best_weights), saved with their tokenizer as
    ``model/``; the model to evaluate is what was exported, read back (transformers' save_pretrained
    writes on rank 0 alone; the other ranks evaluate the same weights in memory)."""
    exported = lora.exported_adapters if isinstance(training.weights, lora.Adapters) else export.exported_weights
    result.best, weights = export.best_weights(out.checkpoints, out.storage, result.best, exported=exported)
    training.weights.load_state_dict(weights)
    if not out.world.is_main:  # under LoRA, merged as rank 0 exports it
        return lora.merged(cast(Any, model)) if isinstance(training.weights, lora.Adapters) else model
    if out.claim is not None:
        out.claim.check()
    with tempfile.TemporaryDirectory() as folder:
        export.write(out.storage, model, loaded.tokenizer, result.best, Path(folder))
        return load_export(Path(folder)).to(training.opt.compute.device)


def report(cfg: Config, training: Training, loaded: Data, out: Outputs, result: TrainResult,
           best_model: torch.nn.Module) -> Dict[str, Any]:
    """The exported model's evaluation, on the task and on eval.extra's sets, its test predictions, and
    results.json, written last."""
    final = loaded.evaluate(best_model, result.best.step)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), exported to %s: %s",
             cfg.task.main_metric, result.best.step, result.steps, out.storage.describe(contract.MODEL_DIR),
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    extra = evalsets.scores(loaded.extras, best_model, result.best.step)
    if extra:
        log.info("the best checkpoint on eval.extra's sets: %s", ", ".join(f"{k}={v:.4f}" for k, v in extra.items()))
        if out.world.is_main:
            training.trackers.log({f"eval/{name}": value for name, value in extra.items()}, step=result.steps)
    _predict_tests(cfg.task, loaded.test, best_model, training.opt.compute, out)
    early = training.early_stopping
    results = {"objective": final.objective, **final.metrics, **extra,
               "train_examples_per_second": result.examples_per_second,
               "train_tokens_per_second": result.tokens_per_second,
               "peak_memory_bytes": device.peak_memory_bytes(training.opt.compute.device),
               "train_seconds": result.seconds, "train_steps": result.steps, "best_step": result.best.step,
               "trainable_parameters": sum(p.numel() for p in training.opt.model.parameters() if p.requires_grad),
               "stopped_early": early.stopped_at if early else None, "identity": digest(out.identity),
               **(xla.compilations() if xla.in_use() else {}), "status": "completed"}
    return _finish(results, training.trackers, out)


def evaluate_only(cfg: Config, raw: DictConfig, out: Outputs, compute: device.Compute,
                  stop: StopRequest) -> Dict[str, Any]:
    """An evaluation-only run: model.name_or_path (a Hub id, a checkpoint directory, or a run folder's
    exported model/) as it was trained, on the task's eval splits and eval.extra's sets, with test
    predictions where train.predict asks; results.json has their metrics, the model evaluated and no
    training figures. The model's labels are matched to each set's by name (nli.evalsets)."""
    world = out.world
    trained = trained_model(cfg.model)
    tokenizer = share_tokenizer(build_tokenizer(trained, [], max_seq_length=cfg.data.max_seq_length), world)
    model = load_trained(trained).to(compute.device)
    labels = head_labels(model.config) if model.config.num_labels > 1 else []  # one output: a regression
    collator = _collator(cfg, tokenizer, compute)
    named = f"model.name_or_path={cfg.model.name_or_path}"
    for task in [cfg.task, *evalsets.extra_tasks(cfg.eval)]:  # every set's labels matched, before any set loads
        evalsets.label_map(labels, task, model=named)
    own = evalsets.prepare(cfg, cfg.task, cfg.data, prefix="", labels=labels, model=named, tokenizer=tokenizer,
                           collator=collator, compute=compute, world=world, predict=cfg.train.predict)
    extras = evalsets.extras(cfg, labels=labels, model=named, tokenizer=tokenizer, collator=collator,
                             compute=compute, world=world)
    stop.check()  # a signal some library swallowed while the sets loaded (nli.signals)
    trackers = Trackers(cfg.logger, enabled=world.is_main)
    _start_trackers(trackers, raw, out)
    final = own.evaluate(model, 0)
    stop.check()
    extra = evalsets.scores(extras, model, 0)
    log.info("evaluation of %s: %s", trained.name_or_path,
             ", ".join(f"{k}={v:.4f}" for k, v in {**final.metrics, **extra}.items()))
    if world.is_main:
        trackers.log({f"eval/{name}": value for name, value in {**final.metrics, **extra}.items()}, step=0)
    _predict_tests(cfg.task, own.test, model, compute, out, label_map=own.evaluate.label_map)
    results = {"objective": final.objective, **final.metrics, **extra, "evaluated_model": trained.name_or_path,
               "identity": digest(out.identity), "status": "completed"}
    return _finish(results, trackers, out)


def _predict_tests(task: TaskConfig, loaders: Dict[str, DataLoader], model: torch.nn.Module, compute: device.Compute,
                   out: Outputs, *, label_map: Optional[np.ndarray] = None) -> None:
    """Each test split's predictions in GLUE's submission format, under predictions/."""
    for split, loader in loaders.items():
        predicted = relabel(gather(predict(model, loader, task, compute), out.world), label_map)
        name, text = submission(task, split, predicted)
        if out.world.is_main:
            out.storage.write_text(f"{contract.PREDICTIONS_DIR}/{name}", text)
        log.info("test predictions for %s written to %s", split, out.storage.describe(contract.PREDICTIONS_DIR, name))


def _finish(results: Dict[str, Any], trackers: Trackers, out: Outputs) -> Dict[str, Any]:
    """results.json, written last (its presence says the run is done), and the loggers' summary."""
    if out.world.is_main:
        if out.claim is not None:
            out.claim.check()
        out.storage.write_text(contract.RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    trackers.finish(results)
    log.info("results: %s", json.dumps(results))
    out.world.barrier()  # no rank returns before the run's outputs are written
    return results


def _start_trackers(trackers: Trackers, raw: DictConfig, out: Outputs) -> None:
    log_dir, remote = _log_dirs(out)
    trackers.start(RunInfo(name=_run_name(out.storage), group=_sweep_name(),
                           config=cast(Dict[str, Any], OmegaConf.to_container(raw, resolve=True)),
                           log_dir=log_dir, resume_id=None, overrides=_job_overrides()), remote=remote)


def _weights(cfg: Config, model: torch.nn.Module) -> Stateful:
    """What a checkpoint holds of the model: every weight; under LoRA only what trains, the adapters and
    the head, the rest built again from model.name_or_path on resume (nli.lora)."""
    return lora.Adapters(cast(Any, model)) if cfg.model.peft is not None else model


def _checkpoints(cfg: Config, storage: Storage, ident: Dict[str, Any]) -> Checkpoints:
    """Checkpoints go to ``<output_dir>/checkpoints``, or to ``train.checkpoint_dir`` (or the
    platform's), each marked with the run's identity."""
    folder = Storage(cfg.train.checkpoint_dir or storage.describe(contract.CHECKPOINTS_DIR))
    if cfg.train.checkpoint_dir and not cfg.eval.only:  # an evaluation-only run writes none
        folder.check_writable()
    return Checkpoints(folder, keep=cfg.train.keep_checkpoints, identity=ident)


def _resume_point(checkpoints: Checkpoints, storage: Storage) -> Optional[Snapshot]:
    """The newest intact checkpoint, with the best checkpoint it names verified now, not at the end:
    where that one is damaged, the best intact evaluated checkpoint (or the export written when it
    became best, which holds its weights) takes its place."""
    snapshot = checkpoints.latest()
    best = snapshot.state["best"]["evaluation"] if snapshot else None
    if snapshot is None or best is None:
        return snapshot
    damage = checkpoints.damage(best["step"])
    if damage is not None:
        instead = export.fallback(checkpoints, storage, Evaluation(**best), damage)
        snapshot.state["best"] = {"evaluation": asdict(instead) if instead else None}
    return snapshot


def _early_stopping(cfg: Config) -> Optional[EarlyStopping]:
    stopping = cfg.train.early_stopping
    if stopping.patience is None:
        return None
    return EarlyStopping(patience=stopping.patience, min_delta=stopping.min_delta, metric=cfg.task.main_metric)


def _hydra_run_dir() -> str:
    if not HydraConfig.initialized():
        raise ConfigError("output_dir is not set and there is no Hydra run directory: set output_dir")
    return str(HydraConfig.get().runtime.output_dir)


def _log_dirs(out: Outputs) -> Tuple[Path, Optional[str]]:
    """Where the loggers write their files (their writers need a local disk), and the bucket folder
    those files belong in, if any: the platform's log directory (Vertex AI's AIP_TENSORBOARD_LOG_DIR),
    else the output directory. Where that is local, they write there; else in the Hydra run
    directory, copied to the bucket at every checkpoint and at the end."""
    target = out.site.log_dir or out.storage.url
    if target and "://" not in target:
        return Path(target), None
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir), target
    return Path(tempfile.mkdtemp(prefix="nli-logs-")), target


def _run_name(storage: Storage) -> str:
    """The Hydra job's overrides (``optimizer.lr=1e-05,seed=2``), else its directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().job.override_dirname:
        return str(HydraConfig.get().job.override_dirname)
    return Path(storage.root).name


def _job_overrides() -> Dict[str, str]:
    """A sweep's job: its overrides (nli.sweep); a single run: none."""
    if _sweep_name() is None:
        return {}
    return sweep.override_columns(list(HydraConfig.get().overrides.task))


def _sweep_name() -> Optional[str]:
    """Jobs of one multirun share a group: the sweep directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().mode == RunMode.MULTIRUN:
        return Path(HydraConfig.get().sweep.dir).name
    return None
