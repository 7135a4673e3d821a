"""One fine-tuning run, in named phases that read top to bottom:

    setup -> data -> model -> optimization -> fit -> export -> report

An evaluation-only run (``eval.only=true``) keeps setup and report, and in between loads the trained
model as it is, with its tokenizer, and the eval splits alone: no optimizer, no checkpoints, no
training set (:func:`evaluate_only`).

Each phase after setup takes the :class:`Run` (its config, where it writes, how it computes) and what
the phases before it made, and hands on a small typed value; what a phase does besides calling the
packages below lives with them. What the run is told besides its config (where it writes, what it is
called) comes in a :class:`~nli.runtime.context.RunContext`: a run is a plain call, from the command
line (nli.cli) or from Python::

    from nli.config import compose
    from nli.runtime import local
    from nli.recipe import run

    cfg = compose(["experiment=quickstart"])
    results = run(cfg, local(cfg, "outputs/notebook"))

A run is resumable: its output directory (local or gs://) holds checkpoints; started again with
the same output directory, it continues from the newest intact checkpoint and ends exactly where an
uninterrupted run would. A run that already finished reports its results again.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Dict, List, Mapping, NamedTuple, Optional, cast

import datasets
import torch
import transformers
from torch.utils.data import DataLoader
from transformers import PreTrainedTokenizerBase

from nli import contract
from nli.config import runfolder
from nli.config.identity import digest, identity, own_folder
from nli.config.keys import key_of
from nli.config.schema import (
    Accelerator,
    Config,
    EvalConfig,
    LoggerConfig,
    ModelConfig,
    Precision,
    TrainConfig,
    checked,
)
from nli.data import loaders as data
from nli.errors import RunChanged
from nli.evaluate import evalsets, oom
from nli.evaluate.evaluation import Evaluation
from nli.io.claim import Claim
from nli.io.storage import Storage
from nli.model import fastpaths, integrity, lora
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
from nli.output import export, results
from nli.output.folder import Outputs, check_continuation, earlier_run, record_code, record_run
from nli.output.modelcard import Card
from nli.output.submission import write_predictions
from nli.runtime import cpu, device, distributed, provenance, xla
from nli.runtime.context import RunContext, console_log
from nli.runtime.distributed import World
from nli.runtime.signals import Interrupted, StopRequest, interruption
from nli.tracking import loggers
from nli.tracking.loggers import Trackers
from nli.train.checkpoint import (
    CHECKPOINTS_CLAIM,
    BestEvaluation,
    Checkpointer,
    Progress,
    RandomState,
    Stateful,
    TrainingState,
    run_checkpoints,
    seed_everything,
    seed_rank,
)
from nli.train.hooks import EarlyStopping, Hook, MetricsLog, ProgressBar, Pruning, Revisit, SyncLogs
from nli.train.loop import Loop, Optimization, Plan, Scaler, TrainResult, grad_scaler
from nli.train.optim import build_optimizer, build_scheduler

log = logging.getLogger(__name__)


@dataclass
class Run:
    """What every phase after setup reads: the config, where the run writes, and how it computes."""

    cfg: Config
    out: Outputs
    compute: device.Compute

    @property
    def world(self) -> World:
        return self.out.world

    @property
    def micro_batch_size(self) -> int:
        return self.cfg.micro_batch_size(self.world.world_size)


@dataclass
class Data:
    tokenizer: PreTrainedTokenizerBase
    train: data.TrainBatches  # this rank's micro-batches of each global batch, and the order of each epoch
    evaluate: oom.Evaluations  # the eval splits' metrics, in smaller batches where they run out of memory
    test: Dict[str, DataLoader]  # test split -> this rank's slice, when predicting
    examples_per_epoch: int
    contents: data.Contents  # of the training set's examples, which a resumed run checks (nli.train.loop)
    eval_contents: data.Contents  # of the main eval split's examples as scored, which pick the best: checked too
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
    pruning: Optional[Pruning] = None  # a search's judgement of the run, through its folder
    export_best: Optional[export.ExportBest] = None  # what this process exported as the best (fit makes it)


def run(cfg: Config, context: RunContext, *, stop: Optional[StopRequest] = None,
        sharing: Optional[cpu.Sharing] = None, console: Optional[bool] = None) -> Dict[str, Any]:
    """The whole run, in the same process on every rank; the results, as results.json holds them.
    ``stop`` (nli.runtime.signals) stops it in any phase, and ``sharing`` (nli.runtime.cpu) sizes its CPU threads: the
    command line starts both before torch loads; a call from Python that passes none gets its own. ``console``: the
    log on stderr where logging is not configured (None), always (True) or never (False)."""
    cfg = checked(cfg)  # composed in Python and edited since: every key and rule again, before anything runs
    with ExitStack() as held:
        held.enter_context(console_log(console))
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
        context.process_env, cuda=device.uses_cuda(cfg.hw),
        timeout=timedelta(minutes=cfg.hw.collective_timeout_minutes),
        rendezvous=timedelta(minutes=cfg.hw.rendezvous_timeout_minutes))
    stage = "starting"
    try:
        with ExitStack() as held:  # the output folder's claim, released however the run ends
            cfg.check_batch(world.world_size)
            out = setup(cfg.train, cfg.logger, context, world, held, evaluation_only=cfg.eval.only)
            if out.finished is not None:  # its model checked, and exported again if it was lost (nli.output.export)
                if cfg.eval.only:
                    check_evaluated_weights(out, cfg.model)
                export.check_finished(out.finished, cfg.model, cfg.task, out, seed=cfg.seed,
                                      card=Card(context.resolved, out.finished.get("provenance") or {},
                                                recorded=out.finished.get("warnings") or [],
                                                continued=out.finished.get("continued") or []))
                log.info("results: %s", results.summary(out.finished))
                return out.finished
            started = device.started_precision(out.snapshot.state if out.snapshot else None)  # kept on resume
            compute = prepare(cfg, world, sharing, started=started)
            out.provenance = provenance.collect(compute, world, context.command)
            if cfg.eval.only:  # a trained model, scored: no optimizer, no checkpoints, no training set
                stage = "evaluating"
                with compute.inference():  # the model trains no more
                    return evaluate_only(Run(cfg, out, compute), stop)
            record_code(out)  # the code of this attempt, beside that of the steps before it
            # A model in a bucket is read from its local copy (nli.model.bucket).
            this_run = Run(dataclasses.replace(cfg, model=local_model(cfg.model, world)), out, compute)
            loaded = load_data(this_run)
            stop.check()  # a signal some library swallowed (nli.runtime.signals) stops the run between phases
            model = build(this_run, loaded)
            training = optimization(this_run, model, loaded)
            record_run(out)  # the attempt has all it needs: the folder's record says it is the run there now
            stop.check()
            stage = "training"
            result = fit(this_run, training, loaded, stop, sharing)
            stage = "finishing"
            if stop.signal:  # it came with the last step: training is whole and checkpointed
                raise Interrupted(stop.signal)
            exported = finish_export(this_run, model, training, loaded, result)
            with compute.inference():  # the model trains no more
                return report(this_run, training, loaded, result, exported)
    except BaseException as error:
        stopped = interruption(error)  # the signal, or an error it caused (nli.runtime.signals.interruption)
        if stopped is None:
            raise
        # In the training stage a first signal stops at once only before the steps take signals over (the loggers'
        # start: W&B's takes seconds): nothing of it was saved, no step was under way.
        stopped.stage = "starting" if stage == "training" and not stopped.second else stage
        if stopped is error:
            raise
        raise stopped from error
    finally:
        distributed.teardown()


def setup(train: TrainConfig, logger: Mapping[str, LoggerConfig], context: RunContext, world: World,
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
    with world.together():  # the others stop with rank 0 where it refuses the folder
        if world.is_main:
            if storage.local:  # said before torch loads too (nli.config.command), of the folder the command names
                runfolder.check_not_in_a_model(Path(storage.root), storage.describe(),
                                               way=f"Give the run its own {own_folder()}")
            storage.check_writable()
            claim = held.enter_context(Claim.take(storage))  # one run at a time in the folder
    ident = identity(context.resolved)
    checkpoints = run_checkpoints(context.checkpoint_dir, storage, ident, keep=train.keep_checkpoints,
                                  writes=not evaluation_only)
    if context.checkpoint_dir and not evaluation_only:
        with world.together():
            if world.is_main:  # two runs at once in one checkpoint folder would overwrite each other's checkpoints
                checkpoints.claim = held.enter_context(Claim.take(checkpoints.storage, use=CHECKPOINTS_CLAIM))
    out = Outputs(storage, checkpoints, context, world, ident, claim, snapshot=None,
                  finished=earlier_run(train, ident, storage, checkpoints))
    if evaluation_only and (ignored := EvalConfig.ignores([key_of(each) for each in context.command])):
        out.warn(f"eval.only=true trains nothing, so it ignores {', '.join(ignored)} (set on the command line)")
    if out.finished is None:
        Trackers(logger, enabled=world.is_main).check()  # e.g. W&B online without a key: before anything loads
        out.snapshot = export.resume_point(checkpoints, storage) if train.resume and not evaluation_only else None
        check_continuation(train, ident, storage, checkpoints, out.snapshot)
    return out


def local_model(cfg: ModelConfig, world: World) -> ModelConfig:
    """``cfg`` with a model in a bucket read from its local copy (nli.model.bucket): made by each machine's first
    process while its others wait (one download a machine), a wrong path or a failed copy stopping every process."""
    if cfg.name_or_path is None or "://" not in cfg.name_or_path or not world.distributed:
        return from_bucket(cfg)
    copied: Optional[ModelConfig] = None
    with world.together():
        if world.local_rank == 0:
            copied = from_bucket(cfg)
    return copied or from_bucket(cfg)  # the others: the copy their machine's first process made


def prepare(cfg: Config, world: World, sharing: cpu.Sharing, *, started: Optional[Precision] = None
            ) -> device.Compute:
    """The seed (the same on every rank: the same initial weights), the CPU threads, the device and
    the precision (``started``: a resumed run's, which it keeps); on the CPU, glibc's heap threshold where
    the config fixes it (nli.runtime.cpu)."""
    hw = cfg.hw
    seed_everything(cfg.seed)
    sharing.start()
    compute = device.resolve(hw, cfg.precision, started=started)
    if compute.device.type == "cpu" and (done := cpu.limit_heap(hw.cpu_mmap_threshold, os.environ)):
        log.info("%s", done)
    if hw.data_parallel_size > world.world_size and world.is_main:
        machines = f" on each of its {hw.nodes} machines" if hw.nodes > 1 else ""
        log.warning("hw has %d GPUs but this run uses %d process(es); gradient accumulation keeps the global batch "
                    "at %d. Start it with %s%s to use them all", hw.data_parallel_size, world.world_size,
                    cfg.train.batch_size, "python -m nli.xla_launch" if hw.accelerator == Accelerator.xla else
                    f"torchrun --nproc-per-node {hw.gpus_per_node}", machines)
    return compute


def load_data(run: Run) -> Data:
    """The task's splits, tokenized once, and their loaders; eval.extra's sets. The tokenizer is the
    checkpoint's when resuming (one learnt from the training text must not change), else the model's."""
    cfg, out = run.cfg, run.out
    task, source, train = cfg.task, cfg.data, cfg.train
    with run.world.together():  # a machine without the files stops the others with it, not at a later collective
        splits = data.load_splits(task, source, seed=cfg.seed, predict=train.predict)
        contents = splits.train_contents(task.text_fields)  # of the text as loaded: the same with any tokenizer
        evaluated = splits.eval_contents(task.main_split, task.text_fields)
    data.check_same_everywhere(run.world, {"training set": contents, f"{task.main_split} split": evaluated})
    tokenizer = (tokenizer_from_files(out.snapshot.tokenizer_files) if out.snapshot else
                 build_tokenizer(cfg.model, splits.train_texts(task.text_fields), max_seq_length=source.max_seq_length))
    scoring = _scoring(run, share_tokenizer(tokenizer, run.world), task.label_names, f"the model of task={task.name}")
    # eval.extra's sets, loaded now: a missing file or labels the model's cannot match stop the run before training.
    extras = evalsets.extras(cfg.eval, source, scoring)
    examples = splits.eval  # as loaded, for the predictions files (nli.evaluate.per_class)
    splits = data.tokenize(splits, scoring.tokenizer, task, source.max_seq_length)
    assert splits.train is not None
    batches = data.train_loader(splits.train, scoring.collator,
                                data.Batching(train.batch_size, run.micro_batch_size, bucket=source.bucket),
                                seed=cfg.seed, world=run.world, num_workers=scoring.num_workers,
                                pin_memory=run.compute.device.type == "cuda")
    own = evalsets.from_splits(task, splits, examples, scoring)
    for note in own.notes:
        out.warn(note)
    return Data(scoring.tokenizer, batches, own.evaluate, own.test, examples_per_epoch=len(splits.train),
                contents=contents, eval_contents=evaluated, extras=extras)


def _scoring(run: Run, tokenizer: PreTrainedTokenizerBase, labels: List[str], model: str) -> evalsets.Scoring:
    """How this run reads and scores its evaluation sets with ``tokenizer``, for a model of ``labels``."""
    cfg, device_type = run.cfg, run.compute.device.type
    collator = data.collator(tokenizer, cfg.data.max_seq_length, device_type, compiled=cfg.train.compile)
    return evalsets.Scoring(tokenizer, collator, labels, model, run.compute, run.world,
                            batch_size=cfg.train.eval_batch_size, num_workers=cfg.data.workers(device_type),
                            seed=cfg.seed)


def build(run: Run, loaded: Data) -> torch.nn.Module:
    """The model (pretrained or from scratch), with LoRA adapters if asked (nli.model.lora), on the device,
    with the fast paths that apply."""
    model_cfg, train = run.cfg.model, run.cfg.train
    model = build_model(model_cfg, run.cfg.task, loaded.tokenizer)
    fast = model_cfg.fast_paths
    if train.gradient_checkpointing:
        # Non-reentrant: works under DDP (no unused-parameter hooks fired twice) and torch.compile, and
        # needs no gradient on its inputs, which LoRA's frozen embeddings would not give.
        checkpointing(model)(use_reentrant=False)
        if fast:  # they replace the layers' forward, which checkpointing wraps
            log.info("fast paths: off, as train.gradient_checkpointing recomputes the stock layers")
            fast = False
    if model_cfg.peft is not None:
        trained: torch.nn.Module = lora.apply(model, model_cfg.peft, revision=model_cfg.revision)
    else:
        log.info("model: %s parameters, all of them train", f"{sum(p.numel() for p in model.parameters()):,}")
        trained = model
    trained = trained.to(run.compute.device)
    # On the transformers model inside peft's wrapper: the fast paths call each layer's Linear modules by
    # name, so LoRA's adapted ones run in them as they do in the stock forward.
    fastpaths.install(unwrap(trained), device=run.compute.device, enabled=fast, compiled=train.compile,
                      distributed=run.world.distributed)
    seed_rank(run.cfg.seed, run.world)
    return trained


def optimization(run: Run, model: torch.nn.Module, loaded: Data) -> Training:
    """The plan, optimizer, schedule and loss scaler; the state a checkpoint holds, restored when
    resuming; then the model wrapped for data parallelism and compiled, if asked."""
    cfg, out, world, compute = run.cfg, run.out, run.world, run.compute
    train, micro_batch_size = cfg.train, run.micro_batch_size
    accumulation = cfg.accumulation_steps(world.world_size)
    plan = Plan.make(train, examples_per_epoch=loaded.examples_per_epoch, world_size=world.world_size,
                     accumulation=accumulation, contents=loaded.contents, main_split=cfg.task.main_split,
                     eval_contents=loaded.eval_contents)
    processes = f" x {world.world_size} processes" if world.distributed else ""
    warmup = cfg.schedule.num_warmup_steps(plan.total_steps)
    log.info("training: %d steps of %d examples (%d x %d accumulated%s), warming up for %d", plan.total_steps,
             train.batch_size, micro_batch_size, accumulation, processes, warmup)
    stopping = train.early_stopping
    if stopping.patience is not None and plan.evaluations <= stopping.patience:
        out.warn(f"train.early_stopping.patience={stopping.patience} ends a run after {stopping.patience} "
                 f"evaluation(s) without a gain, and this run evaluates {plan.evaluations} time(s) in its "
                 f"{plan.total_steps} steps: early stopping cannot end it. Evaluate more often (train.eval_every) "
                 "or lower the patience")
    length = (f"train.max_steps={train.max_steps}" if train.max_steps else
              f"train.epochs={train.epochs} of {plan.examples_per_epoch} examples in batches of {train.batch_size}")
    cfg.schedule.check_warmup(plan.total_steps, length)
    optimizer = build_optimizer(cfg.optimizer, model)
    scheduler = build_scheduler(cfg.schedule, optimizer, plan.total_steps)
    scaler, skips_on_device = grad_scaler(compute)
    progress, best, trackers = Progress(), BestEvaluation(), Trackers(cfg.logger, enabled=world.is_main)
    early = (EarlyStopping(patience=stopping.patience, min_delta=stopping.min_delta, metric=cfg.task.main_metric)
             if stopping.patience is not None else None)
    pruning = Pruning(out.storage, world)
    state = TrainingState()
    # What a checkpoint holds of the model: every weight; under LoRA only what trains, the adapters and the
    # head, the rest built again from model.name_or_path on resume (nli.model.lora).
    weights: Stateful = lora.Adapters(cast(Any, model)) if cfg.model.peft is not None else model
    for name, part in (("model", weights), ("optimizer", optimizer), ("scheduler", scheduler),
                       ("scaler", Scaler(scaler)), ("progress", progress), ("best", best)):
        state.register(name, part)
    if cfg.model.peft is not None:  # the frozen weights are built again on resume: they must be the same
        state.register("frozen", lora.FrozenWeights(model, export.frozen_source(cfg.model)))
    state.register("trackers", trackers, optional=True)
    state.register("compute", compute, optional=True)  # the precision, kept on resume (nli.runtime.device)
    if early is not None:
        state.register("early_stopping", early, optional=True)
    state.register("pruning", pruning, optional=True)  # a pruned run ends where it was pruned, resumed or not
    micro_batches = oom.MicroBatches(micro_batch_size, compute, world)
    state.register("micro_batches", micro_batches, optional=True)  # checkpoints from before it was kept lack it
    state.register("rng", RandomState(world, progress))  # last: nothing restored after it draws from it
    if out.snapshot is not None:
        state.load_state_dict(out.snapshot.state)
        plan.check_resume(progress)  # before the folder records this attempt: a refusal leaves it as it was
        log.info("resuming from checkpoint %s: step %d of %d", out.checkpoints.where(out.snapshot.name),
                 progress.step, plan.total_steps)
        if progress.eval_every and progress.eval_every != plan.eval_every:
            out.warn(_new_cadence(progress, plan, early_stopping=early is not None))
    trained = distributed.wrap(model, world, compute.device)  # after the restore: DDP starts from rank 0's weights
    if train.compile:  # for training steps; evaluation runs the plain model
        trained = cast(torch.nn.Module, torch.compile(trained))  # an OptimizedModule, typed as any callable
    opt = Optimization(model, trained, optimizer, scheduler, scaler, compute, world, skips_on_device=skips_on_device)
    return Training(opt, plan, state, weights, progress, best, early, trackers, micro_batches=micro_batches,
                    pruning=pruning)


def _new_cadence(progress: Progress, plan: Plan, *, early_stopping: bool) -> str:
    """What a resume at another train.eval_every changes: it is outside the run's identity (it leaves the training
    as it is), but the evaluations it makes are the ones that pick the best checkpoint and that early stopping and
    a search's pruning count."""
    counted = "early stopping's patience, " if early_stopping else ""
    return (f"this run evaluated every {progress.eval_every} steps up to step {progress.step} and goes on evaluating "
            f"every {plan.eval_every} (train.eval_every): {counted}a search's pruning and the choice of the best "
            "checkpoint count the evaluations of both, so its model and results can differ from those of a run "
            f"evaluated at either cadence throughout. To go on as it began, set train.eval_every={progress.eval_every}")


def fit(run: Run, training: Training, loaded: Data, stop: StopRequest, sharing: cpu.Sharing) -> TrainResult:
    """Train to the end of the plan, or until a hook or a signal stops it (then the run ends with
    :class:`Preempted`, its checkpoint written)."""
    out, world = run.out, run.world
    if run.cfg.train.compile:  # dynamo guards on torch's thread count, on a GPU too (a global state, not a kernel's)
        sharing.hold("train.compile=true compiles the model for a thread count, and a new one compiles it again")
    loggers.start(training.trackers, out.context, out.storage, resume_step=training.progress.step)
    hooks: list[Hook] = [ProgressBar(total=training.plan.total_steps, initial=training.progress.step,
                                     enabled=run.cfg.train.progress_bar and world.is_main),
                         MetricsLog(training.trackers, main=world.is_main), SyncLogs(training.trackers),
                         Revisit(sharing.revisit)]
    if training.early_stopping is not None:
        hooks.append(training.early_stopping)
    if training.pruning is not None:
        hooks.append(training.pruning)
    training.export_best = export.ExportBest(out.storage, training.opt.model, loaded.tokenizer, main=world.is_main,
                                             card=Card(out.context.resolved, out.provenance, loaded.evaluate.evaluator,
                                                       continued=out.checkpoints.continued))
    hooks.append(training.export_best)
    # A finished run going on with new values (train.accept_changes) holds its earlier end's results.json, whose
    # presence says the run is done: true until its first new checkpoint (a continuation that stops before any step,
    # no micro-batch fitting, leaves the finished run whole), untrue from then until it writes its own at its end.
    checkpointer = Checkpointer(out.checkpoints, training.state, loaded.tokenizer, world, out.claim,
                                outdates=lambda: out.storage.remove(contract.RESULTS_FILE))
    loop = Loop(training.opt, loaded.train, training.plan, evaluate=loaded.evaluate,
                checkpointer=checkpointer, hooks=hooks, micro_batches=training.micro_batches)
    with stop.at_step_boundaries():
        result = loop.run(training.progress, training.best, stop)
    if xla.in_use():  # a number that grows with the steps means shapes that change: each one compiles again
        log.info("XLA compiled %(xla_compilations)d graphs in %(xla_compile_seconds).1f s", xla.compilations())
    return result


class Exported(NamedTuple):
    """What :func:`finish_export` leaves the report: the model to evaluate (None where nothing evaluates it), and its
    final evaluation where the export made it (under LoRA; None elsewhere: the report's :func:`_final_evaluation`)."""

    model: Optional[torch.nn.Module]
    evaluation: Optional[Evaluation] = None


def finish_export(run: Run, model: torch.nn.Module, training: Training, loaded: Data,
                  result: TrainResult) -> Exported:
    """The best checkpoint's weights (nli.output.export.best_weights), saved with their tokenizer as
    ``model/``; the model to evaluate is what was exported, read back, with the fast paths that apply
    (model.fast_paths) as training evaluated (transformers' save_pretrained writes on rank 0 alone; the
    other ranks evaluate the same weights in memory). Where this process exported the best when it was
    evaluated and nothing evaluates the model again (no eval.extra, no test predictions, the final
    evaluation the best's own), ``model/`` is already what this would write: nothing is read or written
    again, and there is no model to evaluate. Under LoRA the exported model merges the adapters, which can
    round a prediction otherwise than the adapters beside the weights did in training (under bf16): it is
    evaluated here, every rank at once, so that the model card and export.json give what ``model/`` scores; so is
    a best checkpoint of an earlier attempt, whose evaluation kept no predictions for the card's warnings."""
    out = run.out
    if training.export_best is not None and training.export_best.exported == result.best \
            and not _evaluates_again(training, loaded, result):
        return Exported(None)
    merges = isinstance(training.weights, lora.Adapters)
    exported = lora.exported_adapters if merges else export.exported_weights
    result.best, weights = export.best_weights(out.checkpoints, out.storage, result.best, exported=exported)
    training.weights.load_state_dict(weights)
    # The card's warnings come from the predictions of the evaluation it describes: a best checkpoint from an earlier
    # attempt kept its figures alone, so the export is evaluated here, not after (its card would have none).
    evaluates = merges or not loaded.evaluate.made(result.best)
    if not out.world.is_main:  # under LoRA, merged as rank 0 exports it
        mine = lora.merged(cast(Any, model)) if merges else model
        return Exported(mine, loaded.evaluate(mine, result.best.step) if evaluates else None)
    if out.claim is not None:
        out.claim.check()
    card = Card(out.context.resolved, out.provenance, loaded.evaluate.evaluator, continued=out.checkpoints.continued)
    # The export is read back from its staging folder, before it is swapped in: no download.
    with out.storage.staged_dir(contract.MODEL_DIR, record=contract.EXPORT_FILE) as folder:
        export.save_weights(folder, model, loaded.tokenizer)
        read_back = load_export(folder).to(run.compute.device)
        fastpaths.install(read_back, device=run.compute.device, enabled=run.cfg.model.fast_paths, trains=False)
        final = loaded.evaluate(read_back, result.best.step) if evaluates else None
        export.describe(folder, final or result.best, card)
    return Exported(read_back, final)


def _evaluates_again(training: Training, loaded: Data, result: TrainResult) -> bool:
    """Whether the report evaluates the exported model: eval.extra's sets, test predictions, or a final
    evaluation that is not the best's own (:func:`_final_evaluation`)."""
    return bool(loaded.extras or loaded.test) or not _evaluated_at_its_step(training, loaded, result)


def _evaluated_at_its_step(training: Training, loaded: Data, result: TrainResult) -> bool:
    return loaded.evaluate.made(result.best) and not isinstance(training.weights, lora.Adapters)


def report(run: Run, training: Training, loaded: Data, result: TrainResult,
           exported: Exported) -> Dict[str, Any]:
    """The exported model's evaluation, on the task and on eval.extra's sets, with each class's figures
    and (eval.save_predictions) each eval split's predictions (nli.output.results), its test predictions,
    and results.json, written last."""
    task, out, best_model = run.cfg.task, run.out, exported.model
    final = exported.evaluation or _final_evaluation(training, loaded, result, best_model)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), exported to %s: %s",
             task.main_metric, result.best.step, result.steps, out.storage.describe(contract.MODEL_DIR),
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    extra_evaluations = (evalsets.evaluations(loaded.extras, best_model, result.best.step)
                         if best_model is not None else [])
    extra = evalsets.scores(extra_evaluations)
    if extra:
        log.info("the best checkpoint on eval.extra's sets: %s", ", ".join(f"{k}={v:.4f}" for k, v in extra.items()))
        if out.world.is_main:
            training.trackers.log_final({f"eval/{name}": value for name, value in extra.items()}, step=result.steps)
    classes = results.analyse([(loaded.evaluate, final), *zip(loaded.extras, extra_evaluations)], training.trackers,
                              out, step=result.steps, save_predictions=run.cfg.eval.save_predictions)
    if best_model is not None:
        out.predicted += write_predictions(task, loaded.test, best_model, loaded.evaluate, out.storage, out.world)
    early, pruned = training.early_stopping, training.pruning.pruned_at if training.pruning else None
    figures = {"objective": final.objective, **final.metrics, **extra, "task": task.name,
               "train_examples_per_second": result.examples_per_second,
               "train_tokens_per_second": result.tokens_per_second,
               "eval_examples_per_second": loaded.evaluate.examples_per_second(),
               "peak_memory_bytes": result.peak_memory_bytes,
               "train_seconds": result.seconds, "train_steps": result.steps, "best_step": result.best.step,
               "train_skipped_steps": result.skipped_steps,
               "trainable_parameters": sum(p.numel() for p in training.opt.model.parameters() if p.requires_grad),
               "stopped_early": early.stopped_at if early else None,
               **({"pruned_at": pruned} if pruned is not None else {}), "identity": digest(out.identity),
               **({"continued": out.checkpoints.continued} if out.checkpoints.continued else {}),
               **(xla.compilations() if xla.in_use() else {}), **classes,
               "status": contract.PRUNED if pruned is not None else contract.COMPLETED}
    return results.finish(figures, training.trackers, out)


def _final_evaluation(training: Training, loaded: Data, result: TrainResult,
                      best_model: Optional[torch.nn.Module]) -> Evaluation:
    """The exported model's evaluation: the best checkpoint's own, whole, where this process made it
    (the exported weights are the ones it evaluated, in the same batches and precision: evaluating them
    again gives the same figures, to rounding where a compiled model ran fewer fast paths than the
    reloaded export does); else evaluated now: the best came from an earlier
    attempt of the run (read from a checkpoint), or from a damaged checkpoint's stand-in. (Under LoRA the
    export evaluates the merged model itself: :func:`finish_export`.)"""
    best = result.best
    if _evaluated_at_its_step(training, loaded, result):
        log.info("the best checkpoint (step %d) was evaluated at its step; that evaluation is its final one",
                 best.step)
        return best
    assert best_model is not None  # finish_export reads it back wherever it is evaluated again
    return loaded.evaluate(best_model, best.step)


def check_evaluated_weights(out: Outputs, model: ModelConfig) -> None:
    """A finished evaluation-only run answers from its results.json only where model.name_or_path's weights are
    still the ones it scored (their SHA-256, ``evaluated_weights``): a run folder trained again since, or a model
    folder replaced, is another model, and its old figures are not of it. A results.json that recorded no
    weights (a Hub id, an earlier version) has nothing to compare."""
    assert out.finished is not None
    recorded = out.finished.get("evaluated_weights")
    if not isinstance(recorded, dict) or model.name_or_path is None:
        return
    trained, where = trained_model(model)
    now = integrity.scored(str(local_model(trained, out.world).name_or_path))
    changed = integrity.changes(recorded, now)
    if changed:
        evaluated = out.finished.get("evaluated_model", where)
        raise RunChanged(f"{out.storage.describe()} holds the evaluation of {evaluated} as it was, and its "
                         f"weights have changed since ({'; '.join(changed)}): the model was trained again or "
                         "replaced, and those results are not of it. Nothing was changed. Give this evaluation its "
                         f"own {own_folder()}, or delete that folder to evaluate there again")


def evaluate_only(run: Run, stop: StopRequest) -> Dict[str, Any]:
    """An evaluation-only run: model.name_or_path (a Hub id, a checkpoint directory, or a run folder's
    exported model/) as it was trained, on the task's eval splits and eval.extra's sets, with test
    predictions where train.predict asks; results.json has their metrics, the model evaluated and no
    training figures. The model's labels are matched to each set's by name (nli.evaluate.evalsets)."""
    cfg, out, world = run.cfg, run.out, run.world
    trained, where = trained_model(cfg.model)
    trained = local_model(trained, world)
    weights = integrity.scored(str(trained.name_or_path))  # an export checked whole, before anything loads
    tokenizer = share_tokenizer(build_tokenizer(trained, [], max_seq_length=cfg.data.max_seq_length), world)
    model = load_trained(trained).to(run.compute.device)
    fastpaths.install(model, device=run.compute.device, enabled=cfg.model.fast_paths,  # as training evaluated
                      trains=False)
    labels = head_labels(model.config) if model.config.num_labels > 1 else []  # one output: a regression
    scoring = _scoring(run, tokenizer, labels, f"model.name_or_path={cfg.model.name_or_path}")
    for each in [cfg.task, *evalsets.extra_tasks(cfg.eval)]:  # every set's labels matched, before any set loads
        evalsets.label_map(labels, each, model=scoring.model)
    own = evalsets.prepare(cfg.task, cfg.data, scoring, predict=cfg.train.predict)
    for note in own.notes:
        out.warn(note)
    extras = evalsets.extras(cfg.eval, cfg.data, scoring)
    stop.check()  # a signal some library swallowed while the sets loaded (nli.runtime.signals)
    record_run(out)
    trackers = Trackers(cfg.logger, enabled=world.is_main)
    loggers.start(trackers, out.context, out.storage)
    final = own.evaluate(model, 0)
    stop.check()
    extra_evaluations = evalsets.evaluations(extras, model, 0)
    extra = evalsets.scores(extra_evaluations)
    log.info("evaluation of %s: %s", where,
             ", ".join(f"{k}={v:.4f}" for k, v in {**final.metrics, **extra}.items()))
    if world.is_main:
        trackers.log_final({f"eval/{name}": value for name, value in {**final.metrics, **extra}.items()}, step=0)
    classes = results.analyse([(own.evaluate, final), *zip(extras, extra_evaluations)], trackers, out, step=0,
                              save_predictions=cfg.eval.save_predictions)
    out.predicted += write_predictions(cfg.task, own.test, model, own.evaluate, out.storage, world)
    figures = {"objective": final.objective, **final.metrics, **extra, "task": cfg.task.name, "evaluated_model": where,
               **({"evaluated_weights": weights} if weights else {}),
               "eval_examples_per_second": own.evaluate.examples_per_second(),
               "identity": digest(out.identity), **classes, "status": contract.COMPLETED}
    return results.finish(figures, trackers, out)
