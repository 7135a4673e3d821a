"""Load a task's splits, tokenize them once, and batch them with dynamic padding."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Dict, Iterator, List

import datasets
import torch
from torch.utils.data import DataLoader, RandomSampler, SequentialSampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from nli import synthetic
from nli.config import DataConfig, TaskConfig
from nli.hub import hub_download

log = logging.getLogger(__name__)

# Where the synthetic task's splits come from: fixed seeds, so the task is the same whatever
# the run's seed is.
SYNTHETIC_SEEDS = {"train": 0, "validation": 1}


@dataclass
class Splits:
    """Raw text columns (the task's ``text_fields``) and ``label``, per split."""

    train: datasets.Dataset
    eval: Dict[str, datasets.Dataset]

    def train_texts(self, text_fields: List[str]) -> Iterator[str]:
        for name in text_fields:
            yield from self.train[name]


def load_splits(task: TaskConfig, data: DataConfig, *, seed: int) -> Splits:
    """The training split and every evaluation split of ``task``, subsampled as ``data`` asks."""
    if task.name == "synthetic":
        raw = datasets.DatasetDict({
            split: datasets.Dataset.from_dict(synthetic.generate(_synthetic_size(data, split), seed=s))
            for split, s in SYNTHETIC_SEEDS.items()
        })
    else:
        with hub_download(f"dataset '{task.hub_dataset}' ({task.hub_config})"):
            raw = datasets.load_dataset(task.hub_dataset, task.hub_config)
    train = _subsample_train(raw[task.train_split], data, seed=seed)
    evals = {split: _first(raw[split], data.max_eval_samples) for split in task.eval_splits}
    log.info("data: %d training examples; eval %s", len(train),
             ", ".join(f"{name}={len(ds)}" for name, ds in evals.items()))
    return Splits(train=train, eval=evals)


def _synthetic_size(data: DataConfig, split: str) -> int:
    return data.synthetic_train_size if split == "train" else data.synthetic_eval_size


def _subsample_train(ds: datasets.Dataset, data: DataConfig, *, seed: int) -> datasets.Dataset:
    if data.fraction_of_train_data < 1:
        keep = math.ceil(data.fraction_of_train_data * len(ds))
        ds = ds.shuffle(seed=seed).select(range(keep))
    return _first(ds, data.max_train_samples)


def _first(ds: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return ds if limit is None or limit >= len(ds) else ds.select(range(limit))


def tokenize(splits: Splits, tokenizer: PreTrainedTokenizerBase, task: TaskConfig,
             max_seq_length: int) -> Splits:
    """Token ids, attention masks and ``labels``; ``datasets`` caches the result on disk for
    datasets that live there (the Hub's), keyed by the tokenizer and these arguments."""

    def encode(batch: Dict[str, list]) -> Dict[str, list]:
        texts = [batch[name] for name in task.text_fields]
        encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length)
        encoded["labels"] = [float(x) for x in batch["label"]] if task.is_regression else batch["label"]
        return encoded

    def apply(ds: datasets.Dataset, name: str) -> datasets.Dataset:
        return ds.map(encode, batched=True, remove_columns=ds.column_names, desc=f"tokenize {name}")

    return Splits(train=apply(splits.train, "train"),
                  eval={name: apply(ds, name) for name, ds in splits.eval.items()})


def train_loader(ds: datasets.Dataset, collator: DataCollatorWithPadding, *, micro_batch_size: int,
                 generator: torch.Generator, num_workers: int, pin_memory: bool) -> DataLoader:
    """Shuffled micro-batches; ``generator`` fixes the order (reseed it per epoch)."""
    return DataLoader(ds, batch_size=micro_batch_size,
                      sampler=RandomSampler(ds, generator=generator), collate_fn=collator,
                      num_workers=num_workers, pin_memory=pin_memory)


def eval_loader(ds: datasets.Dataset, collator: DataCollatorWithPadding, *, batch_size: int,
                num_workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, sampler=SequentialSampler(ds),
                      collate_fn=collator, num_workers=num_workers, pin_memory=pin_memory)
