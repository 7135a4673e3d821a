"""One fine-tuning run, top to bottom: seed, data, model, optimizer, loop, export, results.

A run is resumable. Its output directory (local or gs://) holds checkpoints; started again with
the same output directory, the run continues from the newest intact checkpoint and ends exactly
where an uninterrupted run would. A run that already finished reports its results again.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, Optional

import datasets
import torch
import transformers
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from transformers import AutoTokenizer, DataCollatorWithPadding, PreTrainedTokenizerBase, set_seed

from nli import data, distributed, loop
from nli.checkpoint import CheckpointError, Checkpointer, Progress, Resumed, checkpoint_name, restore_rng, rng_state
from nli.config import Config, ConfigError
from nli.device import peak_memory_bytes, resolve_device, resolve_precision
from nli.distributed import World
from nli.hub import HubUnavailableError
from nli.metrics import Evaluation
from nli.model import build_model, build_tokenizer, install_cpu_paths, load_export, save_pretrained
from nli.optim import build_optimizer, build_scheduler
from nli.predictions import submission
from nli.signals import StopRequest
from nli.sources import DataError
from nli.storage import Storage, StorageError
from nli.tracking import NullTracker, build_tracker

log = logging.getLogger(__name__)

PREEMPTED = 75  # exit status of a run stopped by a signal after its checkpoint (EX_TEMPFAIL: retry)
USER_ERRORS = (ConfigError, DataError, HubUnavailableError, CheckpointError, StorageError)


def main(dict_cfg: DictConfig) -> float:
    """Hydra's task function: run, and return the objective for sweepers to maximise.
    Errors a user can fix end the run with their message alone, not a traceback."""
    try:
        return run(dict_cfg)["objective"]
    except loop.Preempted as err:
        message = (f"preempted, resumable: {err.signal} at step {err.step}, checkpoint written. "
                   "Run the same command again to continue")
        log.warning("%s", message)
        print(message, file=sys.stderr)
        raise SystemExit(PREEMPTED) from None
    except USER_ERRORS as err:
        log.error("%s", err)
        raise SystemExit(f"error: {err}") from None


def run(dict_cfg: DictConfig) -> Dict[str, Any]:
    cfg: Config = OmegaConf.to_object(dict_cfg)  # checks every rule before anything loads
    world = distributed.setup()
    try:
        return _run(cfg, dict_cfg, world)
    finally:
        distributed.teardown()


def _run(cfg: Config, dict_cfg: DictConfig, world: World) -> Dict[str, Any]:
    datasets.disable_progress_bars()  # one progress bar, the training loop's
    transformers.utils.logging.disable_progress_bar()
    if not world.is_main:
        logging.getLogger().setLevel(logging.WARNING)  # rank 0 tells the story; the others only warn
    cfg.check_batch(world.world_size)
    # Each process composed its own config; a Hydra run dir named by the clock may differ by a second.
    cfg.output_dir = world.gather(cfg.output_dir)[0]
    out = Storage(cfg.output_dir)
    if world.is_main:
        out.check_writable()
    world.barrier()
    checkpoints = _checkpointer(cfg, out)
    finished = _finished_results(cfg, out, checkpoints)
    if finished is not None:
        return finished
    if world.is_main:
        out.write_text("config.yaml", OmegaConf.to_yaml(dict_cfg, resolve=True))

    set_seed(cfg.seed)  # the same on every rank: the same initial weights and tokenizer
    device = resolve_device(cfg.hw)
    dtype = resolve_precision(cfg.precision, device)
    _warn_if_gpus_idle(cfg, world)
    splits = data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=cfg.train.predict)
    with tempfile.TemporaryDirectory() as scratch:
        resumed = (checkpoints.resume(Path(scratch) / "tokenizer", examples_per_epoch=len(splits.train))
                   if cfg.train.resume else None)
        tokenizer = (AutoTokenizer.from_pretrained(resumed.tokenizer_dir) if resumed else
                     build_tokenizer(cfg.model, splits.train_texts(cfg.task.text_fields),
                                     max_seq_length=cfg.data.max_seq_length))
    tokenizer = _rank0_tokenizer(tokenizer, world)
    splits = data.tokenize(splits, tokenizer, cfg.task, cfg.data.max_seq_length)
    model = build_model(cfg.model, cfg.task, tokenizer).to(device)
    if device.type == "cpu":
        install_cpu_paths(model, cfg.model, compiled=cfg.train.compile)
    _seed_dropout(cfg.seed, world)

    pin = device.type == "cuda"
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed, and leave a compiled model a
    # handful of shapes to compile for, not one per length; on the CPU they only add padding.
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if pin or cfg.train.compile else None)
    micro_batch_size = cfg.micro_batch_size(world.world_size)
    train_loader, sampler = data.train_loader(splits.train, collator, batch_size=cfg.train.batch_size,
                                              micro_batch_size=micro_batch_size, seed=cfg.seed, world=world,
                                              num_workers=cfg.data.num_workers, pin_memory=pin,
                                              bucket=cfg.data.bucket)

    def in_order(group: Dict[str, datasets.Dataset]) -> Dict[str, DataLoader]:
        return {name: data.eval_loader(ds, collator, batch_size=cfg.train.eval_batch_size, world=world,
                                       num_workers=cfg.data.num_workers, pin_memory=pin) for name, ds in group.items()}

    eval_loaders, test_loaders = in_order(splits.eval), in_order(splits.test)
    plan = loop.Plan.make(examples_per_epoch=len(splits.train), batch_size=cfg.train.batch_size,
                          world_size=world.world_size, accumulation=cfg.accumulation_steps(world.world_size),
                          epochs=cfg.train.epochs, max_steps=cfg.train.max_steps, eval_every=cfg.train.eval_every,
                          log_every=cfg.train.log_every, checkpoint_every=cfg.train.checkpoint_every,
                          max_grad_norm=cfg.train.max_grad_norm, skip_nonfinite=cfg.train.skip_nonfinite)
    log.info("training: %d steps of %d examples (%d x %d accumulated%s)", plan.total_steps, cfg.train.batch_size,
             micro_batch_size, plan.accumulation, f" x {world.world_size} processes" if world.distributed else "")

    optimizer = build_optimizer(cfg.optimizer, model)
    scheduler = build_scheduler(cfg.schedule, optimizer, plan.total_steps)
    scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
    progress, best = _restore(resumed, model, optimizer, scheduler, scaler, plan, checkpoints, world)
    trained = distributed.wrap(model, world, device)  # after the restore: DDP starts from rank 0's weights
    if cfg.train.compile:
        trained = torch.compile(trained)  # for training steps; evaluation runs the plain model
    tracker = build_tracker(cfg.logger, run_name=_run_name(out), group=_sweep_name(),
                            config=OmegaConf.to_container(dict_cfg, resolve=True), log_dir=_log_dir(out),
                            resume_id=resumed.tracker_id if resumed else None) if world.is_main else NullTracker()

    def save(progress: Progress, best: Optional[Evaluation], evaluation: Optional[Evaluation]) -> None:
        # Every rank's generators (dropout differs by rank), written by rank 0 alone; the others
        # wait until it is whole, since the export and a later resume read it.
        rngs = world.gather(rng_state())
        if world.is_main:
            name = checkpoints.save(model=model, tokenizer=tokenizer, optimizer=optimizer, scheduler=scheduler,
                                    scaler=scaler, progress=progress, best=best, evaluation=evaluation,
                                    tracker_id=tracker.run_id, rng_ranks=rngs if world.distributed else None)
            log.info("step %d: checkpoint written to %s", progress.step, checkpoints.where(name))
        world.barrier()

    try:
        with StopRequest() as stop:
            try:
                result = loop.train(
                    model=trained, optimizer=optimizer, scheduler=scheduler, scaler=scaler, loader=train_loader,
                    sampler=sampler, save=save, plan=plan, progress=progress, best=best, stop=stop,
                    evaluate_at=lambda step: loop.evaluate(model, eval_loaders, cfg.task, device=device,
                                                           dtype=dtype, step=step, world=world),
                    device=device, dtype=dtype, tracker=tracker, progress_bar=cfg.train.progress_bar, world=world)
            except loop.Preempted:
                stop.hand_over()  # the checkpoint is written: submitit may requeue the job now
                raise
    except loop.NonFiniteLoss as err:
        newest = checkpoints.newest_step()
        kept = f"the last good checkpoint, step {newest}, is kept in {checkpoints.where()}" if newest is not None \
            else "no checkpoint had been written yet"
        raise ConfigError(f"{err}: stopped, and {kept}. Lower optimizer.lr, compute in precision=fp32 or bf16, "
                          "or let train.skip_nonfinite=N skip up to N such steps") from None

    # Export the best checkpoint, then evaluate exactly what was exported.
    model.load_state_dict(checkpoints.load_model_weights(checkpoint_name(result.best.step)))
    # transformers' save_pretrained writes on rank 0 alone; the other ranks evaluate the same weights in memory.
    best_model: torch.nn.Module = model
    if world.is_main:
        with tempfile.TemporaryDirectory() as export:
            save_pretrained(model, tokenizer, Path(export))
            out.upload_dir(Path(export), "model")
            best_model = load_export(Path(export)).to(device)
    final = loop.evaluate(best_model, eval_loaders, cfg.task, device=device, dtype=dtype, step=result.best.step,
                          world=world)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), exported to %s: %s",
             cfg.task.main_metric, result.best.step, result.steps, out.describe("model"),
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    for split, test_loader in test_loaders.items():
        predicted = loop.gather(loop.predict(best_model, test_loader, cfg.task, device=device, dtype=dtype), world)
        name, text = submission(cfg.task, split, predicted)
        if world.is_main:
            out.write_text(f"predictions/{name}", text)
        log.info("test predictions for %s written to %s", split, out.describe("predictions", name))
    results = {
        "objective": final.objective,
        **final.metrics,
        "train_examples_per_second": result.examples_per_second,
        "train_tokens_per_second": result.tokens_per_second,
        "peak_memory_bytes": peak_memory_bytes(device),
        "train_seconds": result.seconds,
        "train_steps": result.steps,
        "best_step": result.best.step,
        "status": "completed",
    }
    if world.is_main:
        out.write_text("results.json", json.dumps(results, indent=2) + "\n")  # written last: the run is done
    tracker.finish(results)
    log.info("results: %s", json.dumps(results))
    world.barrier()  # no rank returns before the run's outputs are written
    return results


def _checkpointer(cfg: Config, out: Storage) -> Checkpointer:
    """Checkpoints go to ``<output_dir>/checkpoints``, or to ``train.checkpoint_dir`` (on Vertex AI,
    AIP_CHECKPOINT_DIR). Their identity is the model and task: another run's are not resumed."""
    storage = Storage(cfg.train.checkpoint_dir or out.describe("checkpoints"))
    if cfg.train.checkpoint_dir:
        storage.check_writable()
    scratch = cfg.model.scratch
    model = cfg.model.name_or_path or (f"{scratch.model_type} from scratch, {scratch.num_hidden_layers} layers "
                                       f"of {scratch.hidden_size}" if scratch else "")
    return Checkpointer(storage, keep=cfg.train.keep_checkpoints, identity={"model": model, "task": cfg.task.name})


def _finished_results(cfg: Config, out: Storage, checkpoints: Checkpointer) -> Optional[Dict[str, Any]]:
    """The results of this run if it already finished; refuse to start over a run's checkpoints
    when ``train.resume=false``."""
    newest = checkpoints.newest_step()
    if newest is not None and not cfg.train.resume:
        raise CheckpointError(f"{checkpoints.where()} holds a checkpoint of step {newest} and train.resume=false "
                              "refuses to continue or overwrite it. Choose another output_dir (or hydra.run.dir) "
                              "to start afresh, delete that folder, or drop train.resume=false to continue")
    if newest is not None:
        checkpoints.check_identity(newest)
    if not out.exists("results.json"):
        return None
    results = json.loads(out.read_bytes("results.json"))
    log.info("this run already finished; its results, from %s: %s", out.describe("results.json"),
             json.dumps(results))
    return results


def _restore(resumed: Optional[Resumed], model: torch.nn.Module, optimizer: torch.optim.Optimizer, scheduler: Any,
             scaler: torch.amp.GradScaler, plan: loop.Plan, checkpoints: Checkpointer,
             world: World) -> tuple[Progress, Optional[Evaluation]]:
    """Put a checkpoint's state back, random generators last, so that training goes on from
    exactly where it stopped. The weights, optimizer and data position are the same at any world
    size; each rank's generators (dropout) come back only at the world size that saved them."""
    if resumed is None:
        return Progress(), None
    model.load_state_dict(resumed.state["model"])
    optimizer.load_state_dict(resumed.state["optimizer"])
    scheduler.load_state_dict(resumed.state["scheduler"])
    scaler.load_state_dict(resumed.state["scaler"])
    ranks = resumed.state.get("rng_ranks") or [resumed.state["rng"]]
    if len(ranks) == world.world_size:
        restore_rng(ranks[world.rank])
    else:
        # Another world size: rank 0 goes on with the saved rank 0's stream, the others with fresh
        # ones; dropout then differs from an uninterrupted run (without dropout, nothing does).
        restore_rng(ranks[0])
        if world.rank:
            _seed_dropout(resumed.progress.step * 7919 + 1, world)
        log.warning("resuming %d process(es) from a checkpoint of %d: dropout continues on new random streams",
                    world.world_size, len(ranks))
    log.info("resuming from checkpoint %s: step %d of %d", checkpoints.where(resumed.name), resumed.progress.step,
             plan.total_steps)
    return resumed.progress, resumed.best


def _warn_if_gpus_idle(cfg: Config, world: World) -> None:
    if cfg.hw.data_parallel_size > world.world_size and world.is_main:
        machines = f" on each of its {cfg.hw.nodes} machines" if cfg.hw.nodes > 1 else ""
        log.warning("hw has %d GPUs but this run uses %d process(es); gradient accumulation keeps the global batch "
                    "at %d. Start it with torchrun --nproc-per-node %d%s to use them all", cfg.hw.data_parallel_size,
                    world.world_size, cfg.train.batch_size, cfg.hw.gpus_per_node, machines)


def _seed_dropout(seed: int, world: World) -> None:
    """Ranks other than 0 draw dropout from their own stream, so that their masks are not copies of
    rank 0's; rank 0 keeps the stream a single process would use."""
    if world.rank:
        torch.manual_seed(seed * 1_000_003 + world.rank)


def _rank0_tokenizer(tokenizer: PreTrainedTokenizerBase, world: World) -> PreTrainedTokenizerBase:
    """Rank 0's tokenizer on every rank: one learnt from the training text must not differ by a
    token between ranks, or their examples would not mean the same thing."""
    if not world.distributed:
        return tokenizer
    with tempfile.TemporaryDirectory() as tmp:
        if world.is_main:
            tokenizer.save_pretrained(tmp)
        files = world.gather({p.name: p.read_bytes() for p in Path(tmp).iterdir()} if world.is_main else None)[0]
        for name, content in files.items():
            (Path(tmp) / name).write_bytes(content)
        return AutoTokenizer.from_pretrained(tmp)


def _log_dir(out: Storage) -> Path:
    """Where W&B and TensorBoard write their files: the output directory when it is local, else
    the Hydra run directory (their writers need a local disk)."""
    if out.local:
        return Path(out.root)
    if HydraConfig.initialized():
        return Path(HydraConfig.get().runtime.output_dir)
    return Path(tempfile.mkdtemp(prefix="nli-logs-"))


def _run_name(out: Storage) -> str:
    """The Hydra job's overrides (``optimizer.lr=1e-05,seed=2``), else its directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().job.override_dirname:
        return HydraConfig.get().job.override_dirname
    return Path(out.root).name


def _sweep_name() -> str | None:
    """Jobs of one multirun share a group: the sweep directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        return Path(HydraConfig.get().sweep.dir).name
    return None
