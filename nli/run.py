"""One fine-tuning run, top to bottom: seed, data, model, optimizer, loop, export, results."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Dict

import datasets
import torch
import transformers
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig, OmegaConf
from torch.utils.data import DataLoader
from transformers import DataCollatorWithPadding, set_seed

from nli import data, loop
from nli.predictions import write_submission
from nli.sources import DataError
from nli.config import Config, ConfigError
from nli.device import resolve_device, resolve_precision
from nli.hub import HubUnavailableError
from nli.model import build_model, build_tokenizer, load_export, save_pretrained
from nli.optim import build_optimizer, build_scheduler
from nli.tracking import build_tracker

log = logging.getLogger(__name__)

WORLD_SIZE = 1  # one process; data-parallel training comes with torchrun


def main(dict_cfg: DictConfig) -> float:
    """Hydra's task function: run, and return the objective for sweepers to maximise.
    Errors a user can fix end the run with their message alone, not a traceback."""
    try:
        return run(dict_cfg)["objective"]
    except (ConfigError, DataError, HubUnavailableError) as err:
        log.error("%s", err)
        raise SystemExit(f"error: {err}") from None


def run(dict_cfg: DictConfig) -> Dict[str, Any]:
    cfg: Config = OmegaConf.to_object(dict_cfg)  # checks every rule before anything loads
    datasets.disable_progress_bars()  # one progress bar, the training loop's
    transformers.utils.logging.disable_progress_bar()
    cfg.check_batch(WORLD_SIZE)
    output_dir = Path(cfg.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    (output_dir / "config.yaml").write_text(OmegaConf.to_yaml(dict_cfg, resolve=True))

    set_seed(cfg.seed)
    device = resolve_device(cfg.hw)
    dtype = resolve_precision(cfg.precision, device)
    _warn_if_gpus_idle(cfg)

    splits = data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=cfg.train.predict)
    tokenizer = build_tokenizer(cfg.model, splits.train_texts(cfg.task.text_fields),
                                max_seq_length=cfg.data.max_seq_length)
    splits = data.tokenize(splits, tokenizer, cfg.task, cfg.data.max_seq_length)
    model = build_model(cfg.model, cfg.task, tokenizer).to(device)

    pin = device.type == "cuda"
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed; on the CPU they only add padding.
    collator = DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if pin else None)
    generator = torch.Generator()
    train_loader = data.train_loader(splits.train, collator, micro_batch_size=cfg.micro_batch_size(WORLD_SIZE),
                                     generator=generator, num_workers=cfg.data.num_workers, pin_memory=pin)

    def in_order(group: Dict[str, datasets.Dataset]) -> Dict[str, DataLoader]:
        return {name: data.eval_loader(ds, collator, batch_size=cfg.train.eval_batch_size,
                                       num_workers=cfg.data.num_workers, pin_memory=pin) for name, ds in group.items()}

    eval_loaders, test_loaders = in_order(splits.eval), in_order(splits.test)
    plan = loop.Plan.make(micro_batches_per_epoch=len(train_loader), accumulation=cfg.accumulation_steps(WORLD_SIZE),
                          epochs=cfg.train.epochs, max_steps=cfg.train.max_steps, eval_every=cfg.train.eval_every,
                          log_every=cfg.train.log_every, max_grad_norm=cfg.train.max_grad_norm, seed=cfg.seed)
    log.info("training: %d steps of %d examples (%d x %d accumulated)", plan.total_steps, cfg.train.batch_size,
             cfg.micro_batch_size(WORLD_SIZE), plan.accumulation)

    optimizer = build_optimizer(cfg.optimizer, model)
    scheduler = build_scheduler(cfg.schedule, optimizer, plan.total_steps)
    tracker = build_tracker(cfg.logger, run_name=_run_name(output_dir), group=_sweep_name(),
                            config=OmegaConf.to_container(dict_cfg, resolve=True), output_dir=output_dir)

    def export(evaluation: loop.Evaluation) -> None:
        save_pretrained(model, tokenizer, output_dir / "model")
        log.info("saved the model of step %d to %s", evaluation.step, output_dir / "model")

    result = loop.train(
        model=model, optimizer=optimizer, scheduler=scheduler, loader=train_loader, generator=generator,
        evaluate_at=lambda step: loop.evaluate(model, eval_loaders, cfg.task, device=device, dtype=dtype, step=step),
        on_best=export, plan=plan, device=device, dtype=dtype, tracker=tracker, progress_bar=cfg.train.progress_bar,
    )
    # Evaluate what was exported, the best checkpoint, rather than the weights training ended with.
    # (Training's activations are gone, so this copy fits wherever training did.)
    best_model = load_export(output_dir / "model").to(device)
    final = loop.evaluate(best_model, eval_loaders, cfg.task, device=device, dtype=dtype, step=result.best.step)
    log.info("final evaluation of the best checkpoint by %s (step %d of %d), reloaded from %s: %s",
             cfg.task.main_metric, result.best.step, result.steps, output_dir / "model",
             ", ".join(f"{k}={v:.4f}" for k, v in final.metrics.items()))
    for split, loader in test_loaders.items():
        path = write_submission(output_dir / "predictions", cfg.task, split,
                                loop.predict(best_model, loader, cfg.task, device=device, dtype=dtype))
        log.info("test predictions for %s written to %s", split, path)
    results = {
        "objective": final.objective,
        **final.metrics,
        "train_examples_per_second": result.examples_per_second,
        "train_seconds": result.seconds,
        "train_steps": result.steps,
        "best_step": result.best.step,
        "status": "completed",
    }
    (output_dir / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    tracker.finish(results)
    log.info("results: %s", json.dumps(results))
    return results


def _warn_if_gpus_idle(cfg: Config) -> None:
    if cfg.hw.data_parallel_size > WORLD_SIZE:
        log.warning("hw has %d GPUs per node but this run uses %d process; gradient accumulation keeps "
                    "the global batch at %d", cfg.hw.data_parallel_size, WORLD_SIZE, cfg.train.batch_size)


def _run_name(output_dir: Path) -> str:
    """The Hydra job's overrides (``optimizer.lr=1e-05,seed=2``), else its directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().job.override_dirname:
        return HydraConfig.get().job.override_dirname
    return output_dir.name


def _sweep_name() -> str | None:
    """Jobs of one multirun share a group: the sweep directory's name."""
    if HydraConfig.initialized() and HydraConfig.get().mode.name == "MULTIRUN":
        return Path(HydraConfig.get().sweep.dir).name
    return None
