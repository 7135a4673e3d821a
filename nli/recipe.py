"""One fine-tuning run, in named phases that read top to bottom:

    setup -> data -> model -> optimization -> fit -> export -> report

An evaluation-only run (``eval.only=true``) keeps setup and report, and in between loads the trained
model as it is, with its tokenizer, and the eval splits alone: no optimizer, no checkpoints, no
training set (:func:`evaluate_only`).

Each phase takes the parts of the config it reads (``cfg.data`` for the data, ``cfg.model`` for the
model) and what the phases before it made, and hands on a small typed value. What the run is told
besides its config (where it writes, what it is called) comes in a :class:`~nli.runtime.context.RunContext`:
a run is a plain call, from the command line (nli.cli) or from Python::

    from nli.config.schema import compose
    from nli.runtime.context import local
    from nli.recipe import run

    cfg = compose(["experiment=quickstart"])
    results = run(cfg, local(cfg, "outputs/notebook"))

A run is resumable: its output directory (local or gs://) holds checkpoints; started again with
the same output directory, it continues from the newest intact checkpoint and ends exactly where an
uninterrupted run would. A run that already finished reports its results again.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import tempfile
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Tuple, cast

import datasets
import torch
import transformers
from omegaconf import OmegaConf
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase, set_seed

from nli import contract
from nli.config.identity import digest, identity
from nli.config.schema import (
    Accelerator,
    Config,
    DataConfig,
    EvalConfig,
    HardwareConfig,
    LoggerConfig,
    ModelConfig,
    OptimizerConfig,
    Precision,
    PrecisionConfig,
    ScheduleConfig,
    TaskConfig,
    TrainConfig,
)
from nli.data import loaders as data
from nli.evaluate import evalsets, oom, per_class
from nli.evaluate.evaluation import Evaluation, Evaluator, gather, predict, relabel
from nli.io.claim import Claim
from nli.io.storage import Storage
from nli.model import fastpaths, lora
from nli.model.bucket import from_bucket
from nli.model.build import (
    build_model,
    build_tokenizer,
    checkpointing,
    head_labels,
    load_export,
    load_trained,
    share_tokenizer,
    tokenizer_from_files,
    trained_model,
    unwrap,
)
from nli.output import export
from nli.output.folder import check_continuation, earlier_run
from nli.output.modelcard import Card
from nli.output.submission import submission
from nli.runtime import cpu, device, distributed, provenance, xla
from nli.runtime.context import RunContext
from nli.runtime.distributed import World
from nli.runtime.signals import Interrupted, StopRequest, interruption
from nli.tracking.loggers import RunInfo, Trackers
from nli.train.checkpoint import (
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
from nli.train.hooks import EarlyStopping, Hook, MetricsLog, ProgressBar, Revisit, SyncLogs
from nli.train.loop import Loop, Optimization, Plan, Scaler, TrainResult, grad_scaler
from nli.train.optim import build_optimizer, build_scheduler

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

    def warn(self, message: str) -> None:
        log.warning("%s", message)
        self.warnings.append(message)


@dataclass
class Data:
    tokenizer: PreTrainedTokenizerBase
    train: DataLoader  # this rank's micro-batches of each global batch
    sampler: data.EpochSampler  # the order of each epoch
    evaluate: oom.Evaluations  # the eval splits' metrics, in smaller batches where they run out of memory
    test: Dict[str, DataLoader]  # test split -> this rank's slice, when predicting
    examples_per_epoch: int
    extras: List[oom.Evaluations]  # eval.extra's sets, scored at the end (nli.evaluate.evalsets)


@dataclass
class Training:
    opt: Optimization
    plan: Plan
    state: TrainingState  # what a checkpoint holds
    weights: Stateful  # the model's part of it: every weight, or under LoRA the adapters and the head (nli.model.lora)
    progress: Progress
    best: BestEvaluation
    early_stopping: Optional[EarlyStopping]
    trackers: Trackers
    micro_batches: Optional[oom.MicroBatches] = None  # the size that fits, kept in checkpoints (nli.evaluate.oom)


def run(cfg: Config, context: RunContext, *, stop: Optional[StopRequest] = None,
        sharing: Optional[cpu.Sharing] = None) -> Dict[str, Any]:
    """The whole run, in the same process on every rank; the results, as results.json holds them.
    ``stop`` (nli.runtime.signals) stops it in any phase, and ``sharing`` (nli.runtime.cpu) sizes its CPU threads: the
    command line starts both before torch loads; a call from Python that passes none gets its own."""
    with ExitStack() as held:
        if stop is None:
            stop = held.enter_context(StopRequest())
        if sharing is None:
            local_processes = int(context.process_env.get("LOCAL_WORLD_SIZE", "1"))
            sharing = held.enter_context(cpu.Sharing(cfg.hw.cpu_threads, local_processes))
        return _phases(cfg, context, stop, sharing)


def _phases(cfg: Config, context: RunContext, stop: StopRequest, sharing: cpu.Sharing) -> Dict[str, Any]:
    """setup -> data -> model -> optimization -> fit -> export -> report; ``Interrupted.stage`` says how
    far a run stopped by a signal had come."""
    world = xla.setup() if cfg.hw.accelerator == Accelerator.xla else distributed.setup(
        context.process_env, timeout=timedelta(minutes=cfg.hw.collective_timeout_minutes))
    stage = "starting"
    try:
        with ExitStack() as held:  # the output folder's claim, released however the run ends
            cfg.check_batch(world.world_size)
            out = setup(cfg.train, cfg.logger, context, world, held, evaluation_only=cfg.eval.only)
            if out.finished is not None:  # its model checked, and exported again if it was lost (nli.output.export)
                export.check_finished(out.finished, cfg.model, cfg.task, seed=cfg.seed, storage=out.storage,
                                      checkpoints=out.checkpoints, world=world, claim=out.claim,
                                      card=Card(context.resolved, out.finished.get("provenance") or {}))
                return out.finished
            started = device.started_precision(out.snapshot.state if out.snapshot else None)  # kept on resume
            compute = prepare(cfg.hw, cfg.precision, seed=cfg.seed, batch_size=cfg.train.batch_size, world=world,
                              sharing=sharing, started=started)
            out.provenance = provenance.collect(compute, world, context.command)
            if cfg.eval.only:  # a trained model, scored: no optimizer, no checkpoints, no training set
                stage = "evaluating"
                with compute.inference():  # the model trains no more
                    return evaluate_only(cfg.model, cfg.task, cfg.data, cfg.train, cfg.eval, cfg.logger,
                                         seed=cfg.seed, out=out, compute=compute, stop=stop)
            cfg = dataclasses.replace(cfg, model=from_bucket(cfg.model))  # a model in a bucket: its local copy
            loaded = load_data(cfg.task, cfg.data, cfg.model, cfg.train, cfg.eval, seed=cfg.seed,
                               micro_batch_size=cfg.micro_batch_size(world.world_size), out=out, compute=compute)
            stop.check()  # a signal some library swallowed (nli.runtime.signals) stops the run between phases
            model = build(cfg.model, cfg.task, cfg.train, seed=cfg.seed, loaded=loaded, compute=compute, world=world)
            training = optimization(cfg.train, cfg.optimizer, cfg.schedule, cfg.model, cfg.logger,
                                    main_metric=cfg.task.main_metric,
                                    micro_batch_size=cfg.micro_batch_size(world.world_size),
                                    accumulation=cfg.accumulation_steps(world.world_size), model=model, loaded=loaded,
                                    out=out, compute=compute)
            stop.check()
            stage = "training"
            result = fit(cfg.train, training, loaded, out, stop, sharing)
            stage = "finishing"
            if stop.signal:  # it came with the last step: training is whole and checkpointed
                raise Interrupted(stop.signal)
            best_model = finish_export(model, training, loaded, out, result, fast_paths=cfg.model.fast_paths)
            with compute.inference():  # the model trains no more
                return report(cfg.task, training, loaded, out, result, best_model,
                              save_predictions=cfg.eval.save_predictions)
    except BaseException as error:
        stopped = interruption(error)  # the signal, or an error it caused (nli.runtime.signals.interruption)
        if stopped is None:
            raise
        stopped.stage = stage
        if stopped is error:
            raise
        raise stopped from error
    finally:
        distributed.teardown()


def setup(train: TrainConfig, loggers: Mapping[str, LoggerConfig], context: RunContext, world: World,
          held: ExitStack, *, evaluation_only: bool) -> Outputs:
    """The world and the outputs: the output directory, claimed for this run (``held`` to its end),
    its checkpoints, and whether this run has already finished (its results) or stopped part-way (the
    checkpoint to resume from); a folder that holds another run is refused (nli.output.folder)."""
    datasets.disable_progress_bars()  # one progress bar, the training loop's
    transformers.utils.logging.disable_progress_bar()
    if not world.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 tells the story; the others only warn
    # Each process made its own context; a Hydra run dir named by the clock may differ by a second.
    output_dir = world.gather(context.output_dir)[0]
    storage = Storage(output_dir)
    claim = None
    if world.is_main:
        storage.check_writable()
        claim = held.enter_context(Claim.take(storage))  # one run at a time in the folder
    world.barrier()
    ident = identity(context.resolved)
    checkpoints = _checkpoints(context.checkpoint_dir, storage, ident, keep=train.keep_checkpoints,
                               writes=not evaluation_only)
    out = Outputs(storage, checkpoints, context, world, ident, claim, snapshot=None,
                  finished=earlier_run(train, ident, storage, checkpoints))
    if evaluation_only and (ignored := EvalConfig.ignores([_key(each) for each in context.command])):
        out.warn(f"eval.only=true trains nothing, so it ignores {', '.join(ignored)} (set on the command line)")
    if out.finished is None:
        Trackers(loggers, enabled=world.is_main).check()  # e.g. W&B online without a key: before anything loads
        out.snapshot = _resume_point(checkpoints, storage) if train.resume and not evaluation_only else None
        check_continuation(train, ident, storage, checkpoints, out.snapshot)  # before config.yaml is replaced
        if world.is_main:  # the folder's record of its run: the resolved directories, as the run uses them
            storage.write_text(contract.CONFIG_FILE, OmegaConf.to_yaml(_as_run(context, output_dir)))
            storage.write_text(contract.OVERRIDES_FILE, OmegaConf.to_yaml(context.command))
    return out


def _as_run(context: RunContext, output_dir: str) -> Dict[str, Any]:
    """The resolved config with the directories the run writes to, as config.yaml records it."""
    train = {**context.resolved["train"], "checkpoint_dir": context.checkpoint_dir}
    return {**context.resolved, "output_dir": output_dir, "train": train}


def prepare(hw: HardwareConfig, precision: PrecisionConfig, *, seed: int, batch_size: int, world: World,
            sharing: cpu.Sharing, started: Optional[Precision] = None) -> device.Compute:
    """The seed (the same on every rank: the same initial weights), the CPU threads, the device and
    the precision (``started``: a resumed run's, which it keeps); on the CPU, glibc's heap threshold where
    the config fixes it (nli.runtime.cpu)."""
    set_seed(seed)
    sharing.start()
    compute = device.resolve(hw, precision, started=started)
    if compute.device.type == "cpu" and (done := cpu.limit_heap(hw.cpu_mmap_threshold, os.environ)):
        log.info("%s", done)
    if hw.data_parallel_size > world.world_size and world.is_main:
        machines = f" on each of its {hw.nodes} machines" if hw.nodes > 1 else ""
        log.warning("hw has %d GPUs but this run uses %d process(es); gradient accumulation keeps the global batch "
                    "at %d. Start it with %s%s to use them all", hw.data_parallel_size, world.world_size,
                    batch_size, "python -m nli.xla_launch" if hw.accelerator == Accelerator.xla else
                    f"torchrun --nproc-per-node {hw.gpus_per_node}", machines)
    return compute


def load_data(task: TaskConfig, source: DataConfig, model: ModelConfig, train: TrainConfig, evaluation: EvalConfig,
              *, seed: int, micro_batch_size: int, out: Outputs, compute: device.Compute) -> Data:
    """The task's splits, tokenized once, and their loaders; eval.extra's sets. The tokenizer is the
    checkpoint's when resuming (one learnt from the training text must not change), else the model's."""
    world = out.world
    splits = data.load_splits(task, source, seed=seed, predict=train.predict)
    tokenizer = (tokenizer_from_files(out.snapshot.tokenizer_files) if out.snapshot else
                 build_tokenizer(model, splits.train_texts(task.text_fields), max_seq_length=source.max_seq_length))
    tokenizer = share_tokenizer(tokenizer, world)
    # eval.extra's sets, loaded now: a missing file or labels the model's cannot match stop the run before training.
    collator = _collator(source.max_seq_length, tokenizer, compute, compiled=train.compile)
    extras = evalsets.extras(evaluation, source, eval_batch_size=train.eval_batch_size, seed=seed,
                             labels=task.label_names, model=f"the model of task={task.name}", tokenizer=tokenizer,
                             collator=collator, compute=compute, world=world)
    examples = splits.eval  # as loaded, for the predictions files (nli.evaluate.per_class)
    splits = data.tokenize(splits, tokenizer, task, source.max_seq_length)
    assert splits.train is not None
    pin = compute.device.type == "cuda"
    loader, sampler = data.train_loader(splits.train, collator, batch_size=train.batch_size,
                                        micro_batch_size=micro_batch_size, seed=seed, world=world,
                                        num_workers=source.workers(compute.device.type), pin_memory=pin,
                                        bucket=source.bucket)
    in_order = {name: data.eval_loader(ds, collator, batch_size=train.eval_batch_size, world=world,
                                       num_workers=source.workers(compute.device.type), pin_memory=pin)
                for name, ds in {**splits.eval, **splits.test}.items()}
    evaluator = oom.Evaluations(Evaluator({name: in_order[name] for name in splits.eval}, task, compute, world,
                                          groups=splits.groups, examples=examples))
    return Data(tokenizer, loader, sampler, evaluator, {name: in_order[name] for name in splits.test},
                examples_per_epoch=len(splits.train), extras=extras)


def _collator(max_seq_length: int, tokenizer: PreTrainedTokenizerBase, compute: device.Compute, *,
              compiled: bool) -> data.Collator:
    if compute.device.type == "xla":  # a graph compiled per input shape: a few lengths, not one per batch
        return data.BucketPadding(tokenizer, max_seq_length)
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed, and leave a compiled model a
    # handful of shapes to compile for, not one per length; on the CPU they only add padding.
    pad = 8 if compute.device.type == "cuda" or compiled else None
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad)


def build(model_cfg: ModelConfig, task: TaskConfig, train: TrainConfig, *, seed: int, loaded: Data,
          compute: device.Compute, world: World) -> torch.nn.Module:
    """The model (pretrained or from scratch), with LoRA adapters if asked (nli.model.lora), on the device,
    with the fast paths that apply."""
    model = build_model(model_cfg, task, loaded.tokenizer)
    fast = model_cfg.fast_paths
    if train.gradient_checkpointing:
        # Non-reentrant: works under DDP (no unused-parameter hooks fired twice) and torch.compile, and
        # needs no gradient on its inputs, which LoRA's frozen embeddings would not give.
        checkpointing(model)(use_reentrant=False)
        if fast:  # they replace the layers' forward, which checkpointing wraps
            log.info("fast paths: off, as train.gradient_checkpointing recomputes the stock layers")
            fast = False
    if model_cfg.peft is not None:
        trained: torch.nn.Module = lora.apply(model, model_cfg.peft)
    else:
        log.info("model: %s parameters, all of them train", f"{sum(p.numel() for p in model.parameters()):,}")
        trained = model
    trained = trained.to(compute.device)
    # On the transformers model inside peft's wrapper: the fast paths call each layer's Linear modules by
    # name, so LoRA's adapted ones run in them as they do in the stock forward.
    fastpaths.install(unwrap(trained), device=compute.device, enabled=fast, compiled=train.compile)
    seed_rank(seed, world)
    return trained


def optimization(train: TrainConfig, optimizer_cfg: OptimizerConfig, schedule: ScheduleConfig, model_cfg: ModelConfig,
                 loggers: Mapping[str, LoggerConfig], *, main_metric: str, micro_batch_size: int,
                 accumulation: int, model: torch.nn.Module, loaded: Data, out: Outputs,
                 compute: device.Compute) -> Training:
    """The plan, optimizer, schedule and loss scaler; the state a checkpoint holds, restored when
    resuming; then the model wrapped for data parallelism and compiled, if asked."""
    world = out.world
    plan = Plan.make(train, examples_per_epoch=loaded.examples_per_epoch, world_size=world.world_size,
                     accumulation=accumulation)
    log.info("training: %d steps of %d examples (%d x %d accumulated%s)", plan.total_steps, train.batch_size,
             micro_batch_size, accumulation, f" x {world.world_size} processes" if world.distributed else "")
    patience = train.early_stopping.patience
    if patience is not None and plan.evaluations <= patience:
        out.warn(f"train.early_stopping.patience={patience} ends a run after {patience} evaluation(s) without a gain, "
                 f"and this run evaluates {plan.evaluations} time(s) in its {plan.total_steps} steps: early stopping "
                 "cannot end it. Evaluate more often (train.eval_every) or lower the patience")
    length = (f"train.max_steps={train.max_steps}" if train.max_steps else
              f"train.epochs={train.epochs} of {plan.examples_per_epoch} examples in batches of {train.batch_size}")
    schedule.check_warmup(plan.total_steps, length)
    optimizer = build_optimizer(optimizer_cfg, model)
    scheduler = build_scheduler(schedule, optimizer, plan.total_steps)
    scaler, skips_on_device = grad_scaler(compute)
    progress, best, trackers = Progress(), BestEvaluation(), Trackers(loggers, enabled=world.is_main)
    early = _early_stopping(train, main_metric)
    state = TrainingState()
    weights = _weights(model_cfg, model)
    for name, part in (("model", weights), ("optimizer", optimizer), ("scheduler", scheduler),
                       ("scaler", Scaler(scaler)), ("progress", progress), ("best", best)):
        state.register(name, part)
    if model_cfg.peft is not None:  # the frozen weights are built again on resume: they must be the same
        state.register("frozen", lora.FrozenWeights(model, export.frozen_source(model_cfg)))
    state.register("trackers", trackers, optional=True)
    state.register("compute", compute, optional=True)  # the precision, kept on resume (nli.runtime.device)
    if early is not None:
        state.register("early_stopping", early, optional=True)
    micro_batches = oom.MicroBatches(micro_batch_size, compute, world)
    state.register("micro_batches", micro_batches, optional=True)  # checkpoints from before it was kept lack it
    state.register("rng", RandomState(world, progress))  # last: nothing restored after it draws from it
    if out.snapshot is not None:
        state.load_state_dict(out.snapshot.state)
        log.info("resuming from checkpoint %s: step %d of %d", out.checkpoints.where(out.snapshot.name),
                 progress.step, plan.total_steps)
    trained = distributed.wrap(model, world, compute.device)  # after the restore: DDP starts from rank 0's weights
    if train.compile:  # for training steps; evaluation runs the plain model
        trained = cast(torch.nn.Module, torch.compile(trained))  # an OptimizedModule, typed as any callable
    opt = Optimization(model, trained, optimizer, scheduler, scaler, compute, world, skips_on_device=skips_on_device)
    return Training(opt, plan, state, weights, progress, best, early, trackers, micro_batches=micro_batches)


def fit(train: TrainConfig, training: Training, loaded: Data, out: Outputs, stop: StopRequest,
        sharing: cpu.Sharing) -> TrainResult:
    """Train to the end of the plan, or until a hook or a signal stops it (then the run ends with
    :class:`Preempted`, its checkpoint written)."""
    world = out.world
    _start_trackers(training.trackers, out, resume_step=training.progress.step)
    hooks: list[Hook] = [ProgressBar(total=training.plan.total_steps, initial=training.progress.step,
                                     enabled=train.progress_bar and world.is_main),
                         MetricsLog(training.trackers, main=world.is_main), SyncLogs(training.trackers),
                         Revisit(sharing.revisit)]
    if training.early_stopping is not None:
        hooks.append(training.early_stopping)
    hooks.append(export.ExportBest(out.storage, training.opt.model, loaded.tokenizer, main=world.is_main,
                                   card=Card(out.context.resolved, out.provenance)))
    checkpointer = Checkpointer(out.checkpoints, training.state, loaded.tokenizer, world, out.claim)
    loop = Loop(training.opt, loaded.train, loaded.sampler, training.plan, evaluate=loaded.evaluate,
                checkpointer=checkpointer, hooks=hooks, micro_batches=training.micro_batches)
    with stop.at_step_boundaries():
        result = loop.run(training.progress, training.best, stop)
    if xla.in_use():  # a number that grows with the steps means shapes that change: each one compiles again
        log.info("XLA compiled %(xla_compilations)d graphs in %(xla_compile_seconds).1f s", xla.compilations())
    return result


def finish_export(model: torch.nn.Module, training: Training, loaded: Data, out: Outputs,
                  result: TrainResult, *, fast_paths: bool = True) -> torch.nn.Module:
    """The best checkpoint's weights (nli.output.export.best_weights), saved with their tokenizer as
    ``model/``; the model to evaluate is what was exported, read back, with the fast paths that apply
    (``fast_paths``: model.fast_paths) as training evaluated (transformers' save_pretrained writes on
    rank 0 alone; the other ranks evaluate the same weights in memory)."""
    exported = lora.exported_adapters if isinstance(training.weights, lora.Adapters) else export.exported_weights
    result.best, weights = export.best_weights(out.checkpoints, out.storage, result.best, exported=exported)
    training.weights.load_state_dict(weights)
    if not out.world.is_main:  # under LoRA, merged as rank 0 exports it
        return lora.merged(cast(Any, model)) if isinstance(training.weights, lora.Adapters) else model
    if out.claim is not None:
        out.claim.check()
    with tempfile.TemporaryDirectory() as folder:
        export.write(out.storage, model, loaded.tokenizer, result.best, Path(folder),
                     Card(out.context.resolved, out.provenance))
        exported = load_export(Path(folder)).to(training.opt.compute.device)
    fastpaths.install(exported, device=training.opt.compute.device, enabled=fast_paths)
    return exported


def report(task: TaskConfig, training: Training, loaded: Data, out: Outputs, result: TrainResult,
           best_model: torch.nn.Module, *, save_predictions: bool) -> Dict[str, Any]:
    """The exported model's evaluation, on the task and on eval.extra's sets, with each class's figures
    and (``save_predictions``) each eval split's predictions (nli.evaluate.per_class), its test predictions, and
    results.json, written last."""
    final = _final_evaluation(training, loaded, result, best_model)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), exported to %s: %s",
             task.main_metric, result.best.step, result.steps, out.storage.describe(contract.MODEL_DIR),
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    extra_evaluations = evalsets.evaluations(loaded.extras, best_model, result.best.step)
    extra = evalsets.scores(extra_evaluations)
    if extra:
        log.info("the best checkpoint on eval.extra's sets: %s", ", ".join(f"{k}={v:.4f}" for k, v in extra.items()))
        if out.world.is_main:
            training.trackers.log({f"eval/{name}": value for name, value in extra.items()}, step=result.steps)
    classes = _analyse([(loaded.evaluate, final), *zip(loaded.extras, extra_evaluations)],
                       training.trackers, out, step=result.steps, save_predictions=save_predictions)
    _predict_tests(task, loaded.test, best_model, out, evaluations=loaded.evaluate)
    early = training.early_stopping
    results = {"objective": final.objective, **final.metrics, **extra,
               "train_examples_per_second": result.examples_per_second,
               "train_tokens_per_second": result.tokens_per_second,
               "eval_examples_per_second": loaded.evaluate.examples_per_second(),
               "peak_memory_bytes": result.peak_memory_bytes,
               "train_seconds": result.seconds, "train_steps": result.steps, "best_step": result.best.step,
               "trainable_parameters": sum(p.numel() for p in training.opt.model.parameters() if p.requires_grad),
               "stopped_early": early.stopped_at if early else None, "identity": digest(out.identity),
               **({"continued": out.checkpoints.continued} if out.checkpoints.continued else {}),
               **(xla.compilations() if xla.in_use() else {}), **classes, "status": "completed"}
    return _finish(results, training.trackers, out)


def _final_evaluation(training: Training, loaded: Data, result: TrainResult,
                      best_model: torch.nn.Module) -> Evaluation:
    """The exported model's evaluation: the best checkpoint's own, whole, where this process made it
    (the exported weights are the ones it evaluated, in the same batches and precision: evaluating them
    again gives the same figures, to rounding where a compiled model ran fewer fast paths than the
    reloaded export does); else evaluated now: the best came from an earlier
    attempt of the run (read from a checkpoint), or from a damaged checkpoint's stand-in, or under
    LoRA, where the exported model merges the adapters the evaluation ran beside the weights."""
    best = result.best
    if loaded.evaluate.made(best) and not isinstance(training.weights, lora.Adapters):
        log.info("the best checkpoint (step %d) was evaluated at its step; that evaluation is its final one",
                 best.step)
        return best
    return loaded.evaluate(best_model, best.step)


def evaluate_only(model_cfg: ModelConfig, task: TaskConfig, source: DataConfig, train: TrainConfig,
                  evaluation: EvalConfig, loggers: Mapping[str, LoggerConfig], *, seed: int, out: Outputs,
                  compute: device.Compute, stop: StopRequest) -> Dict[str, Any]:
    """An evaluation-only run: model.name_or_path (a Hub id, a checkpoint directory, or a run folder's
    exported model/) as it was trained, on the task's eval splits and eval.extra's sets, with test
    predictions where train.predict asks; results.json has their metrics, the model evaluated and no
    training figures. The model's labels are matched to each set's by name (nli.evaluate.evalsets)."""
    trained, where = trained_model(model_cfg)
    trained = from_bucket(trained)  # a model in a bucket: its local copy (nli.model.bucket)
    return _evaluate(trained, where, model_cfg, task, source, train, evaluation, loggers, seed=seed, out=out,
                     compute=compute, stop=stop)


def _evaluate(trained: ModelConfig, where: str, model_cfg: ModelConfig, task: TaskConfig, source: DataConfig,
              train: TrainConfig, evaluation: EvalConfig, loggers: Mapping[str, LoggerConfig], *, seed: int,
              out: Outputs, compute: device.Compute, stop: StopRequest) -> Dict[str, Any]:
    world = out.world
    tokenizer = share_tokenizer(build_tokenizer(trained, [], max_seq_length=source.max_seq_length), world)
    model = load_trained(trained).to(compute.device)
    fastpaths.install(model, device=compute.device, enabled=model_cfg.fast_paths)  # as training evaluated
    labels = head_labels(model.config) if model.config.num_labels > 1 else []  # one output: a regression
    collator = _collator(source.max_seq_length, tokenizer, compute, compiled=train.compile)
    named = f"model.name_or_path={model_cfg.name_or_path}"
    for each in [task, *evalsets.extra_tasks(evaluation)]:  # every set's labels matched, before any set loads
        evalsets.label_map(labels, each, model=named)
    own = evalsets.prepare(task, source, prefix="", predict=train.predict, eval_batch_size=train.eval_batch_size,
                           seed=seed, labels=labels, model=named, tokenizer=tokenizer, collator=collator,
                           compute=compute, world=world)
    extras = evalsets.extras(evaluation, source, eval_batch_size=train.eval_batch_size, seed=seed, labels=labels,
                             model=named, tokenizer=tokenizer, collator=collator, compute=compute, world=world)
    stop.check()  # a signal some library swallowed while the sets loaded (nli.runtime.signals)
    trackers = Trackers(loggers, enabled=world.is_main)
    _start_trackers(trackers, out)
    final = own.evaluate(model, 0)
    stop.check()
    extra_evaluations = evalsets.evaluations(extras, model, 0)
    extra = evalsets.scores(extra_evaluations)
    log.info("evaluation of %s: %s", where,
             ", ".join(f"{k}={v:.4f}" for k, v in {**final.metrics, **extra}.items()))
    if world.is_main:
        trackers.log({f"eval/{name}": value for name, value in {**final.metrics, **extra}.items()}, step=0)
    classes = _analyse([(own.evaluate, final), *zip(extras, extra_evaluations)], trackers, out, step=0,
                       save_predictions=evaluation.save_predictions)
    _predict_tests(task, own.test, model, out, evaluations=own.evaluate)
    results = {"objective": final.objective, **final.metrics, **extra, "evaluated_model": where,
               "eval_examples_per_second": own.evaluate.examples_per_second(),
               "identity": digest(out.identity), **classes, "status": "completed"}
    return _finish(results, trackers, out)


def _analyse(evaluated: List[Tuple[oom.Evaluations, Evaluation]], trackers: Trackers, out: Outputs, *, step: int,
             save_predictions: bool) -> Dict[str, Any]:
    """The final evaluations' per-class figures and confusion matrices, to the loggers (at ``step``) and
    for results.json; with ``save_predictions``, each eval split's predictions under eval_predictions/."""
    scored = [(evaluations.evaluator, evaluation) for evaluations, evaluation in evaluated]  # the batches that fit
    analyses = per_class.analyse(scored)
    if out.world.is_main:
        trackers.log_classes(analyses, step=step)
        if save_predictions:
            if out.claim is not None:
                out.claim.check()
            for name, text in per_class.files(scored):
                out.storage.write_text(name, text)
    if save_predictions:
        log.info("each eval example's prediction written to %s", out.storage.describe(per_class.FOLDER))
    return per_class.results(analyses)


def _predict_tests(task: TaskConfig, loaders: Dict[str, DataLoader], model: torch.nn.Module, out: Outputs, *,
                   evaluations: oom.Evaluations) -> None:
    """Each test split's predictions in GLUE's submission format, under predictions/: in the batches the
    evaluations found to fit (or smaller, where these do not), with their labels' map."""
    evaluator, size = evaluations.evaluator, evaluations.batch_size()
    for split, loader in loaders.items():
        predicted, size = oom.fitting(lambda each: relabel(gather(predict(model, each, task, evaluator.compute),
                                                                  out.world), evaluator.label_map),
                                      oom.at_most(loader, size), evaluator.compute, out.world)
        name, text = submission(task, split, predicted)
        if out.world.is_main:
            out.storage.write_text(f"{contract.PREDICTIONS_DIR}/{name}", text)
        log.info("test predictions for %s written to %s", split, out.storage.describe(contract.PREDICTIONS_DIR, name))


def _key(override: str) -> str:
    """An override's key or group, as typed: ``+optimizer.lr=1`` -> ``optimizer.lr``."""
    return override.split("=", 1)[0].lstrip("+~").split("@", 1)[0]


def _finish(results: Dict[str, Any], trackers: Trackers, out: Outputs) -> Dict[str, Any]:
    """results.json, written last (its presence says the run is done), and the loggers' summary."""
    # Before the status, which stays last: where the numbers came from, and what could not take effect.
    extra = {**({"provenance": out.provenance} if out.provenance else {}),
             **({"warnings": out.warnings} if out.warnings else {})}
    results = {**{k: v for k, v in results.items() if k != "status"}, **extra, "status": results.get("status")}
    if out.world.is_main:
        if out.claim is not None:
            out.claim.check()
        out.storage.write_text(contract.RESULTS_FILE, json.dumps(results, indent=2) + "\n")
    trackers.finish(results)
    log.info("results: %s", json.dumps(results))
    if out.world.is_main:
        log.info("%s", _files(out, trackers, exported="evaluated_model" not in results))
    out.world.barrier()  # no rank returns before the run's outputs are written
    return results


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
    if log_file is not None and log_file.is_file():
        places["log"] = str(log_file)
    places.update(trackers.places())
    width = max(map(len, places))
    return "The run's files:\n" + "\n".join(f"  {name:<{width}}  {where}" for name, where in places.items())


def _start_trackers(trackers: Trackers, out: Outputs, *, resume_step: Optional[int] = None) -> None:
    """``resume_step``: a training run's first step less one (nli.tracking.RunInfo); a training run
    (one with a ``resume_step``) exports its model to model/."""
    context = out.context
    log_dir, remote = _log_dirs(context, out.storage)
    model_dir = out.storage.describe(contract.MODEL_DIR) if resume_step is not None else None
    trackers.start(RunInfo(name=context.run_name, group=context.group, config=context.resolved, log_dir=log_dir,
                           resume_id=None, overrides=context.overrides, resume_step=resume_step, model_dir=model_dir),
                   remote=remote)


def _weights(model_cfg: ModelConfig, model: torch.nn.Module) -> Stateful:
    """What a checkpoint holds of the model: every weight; under LoRA only what trains, the adapters and
    the head, the rest built again from model.name_or_path on resume (nli.model.lora)."""
    return lora.Adapters(cast(Any, model)) if model_cfg.peft is not None else model


def _checkpoints(checkpoint_dir: Optional[str], storage: Storage, ident: Dict[str, Any], *, keep: int,
                 writes: bool) -> Checkpoints:
    """Checkpoints go to ``<output_dir>/checkpoints``, or to ``checkpoint_dir`` (train.checkpoint_dir or
    the platform's), each marked with the run's identity. A run that ``writes`` none (evaluation only)
    does not check that it could."""
    folder = Storage(checkpoint_dir or storage.describe(contract.CHECKPOINTS_DIR))
    if checkpoint_dir and writes:
        folder.check_writable()
    return Checkpoints(folder, keep=keep, identity=ident)


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
        snapshot.state["best"] = {**snapshot.state["best"], "evaluation": asdict(instead) if instead else None}
    return snapshot


def _early_stopping(train: TrainConfig, main_metric: str) -> Optional[EarlyStopping]:
    stopping = train.early_stopping
    if stopping.patience is None:
        return None
    return EarlyStopping(patience=stopping.patience, min_delta=stopping.min_delta, metric=main_metric)


def _log_dirs(context: RunContext, storage: Storage) -> Tuple[Path, Optional[str]]:
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
