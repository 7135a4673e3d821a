"""Load a task's splits, tokenize them once, and batch them with dynamic padding."""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import Dict, Iterator, List, Tuple

import datasets
import torch
from torch.utils.data import DataLoader, Sampler, SequentialSampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from nli import sources
from nli.config import DataConfig, TaskConfig

log = logging.getLogger(__name__)


@dataclass
class Splits:
    """Per split: the task's text columns, ``label`` and ``idx`` (raw), or model inputs (tokenized)."""

    train: datasets.Dataset
    eval: Dict[str, datasets.Dataset]
    test: Dict[str, datasets.Dataset] = field(default_factory=dict)  # only when predicting

    def train_texts(self, text_fields: List[str]) -> Iterator[str]:
        for name in text_fields:
            yield from self.train[name]


def load_splits(task: TaskConfig, data: DataConfig, *, seed: int, predict: bool) -> Splits:
    """The training split, every evaluation split and, to ``predict``, the test splits of
    ``task``, subsampled as ``data`` asks."""
    test_splits = list(task.test_splits) if predict else []
    raw = sources.load(task, data, [task.train_split, *task.eval_splits, *test_splits])
    train = _subsample_train(raw[task.train_split], data, seed=seed)
    evals = {split: _first(raw[split], data.max_eval_samples) for split in task.eval_splits}
    log.info("data: %d training examples; eval %s%s", len(train),
             ", ".join(f"{name}={len(ds)}" for name, ds in evals.items()),
             "".join(f"; test {name}={len(raw[name])}" for name in test_splits))
    return Splits(train=train, eval=evals, test={split: raw[split] for split in test_splits})


def _subsample_train(ds: datasets.Dataset, data: DataConfig, *, seed: int) -> datasets.Dataset:
    if data.fraction_of_train_data < 1:
        keep = math.ceil(data.fraction_of_train_data * len(ds))
        ds = ds.shuffle(seed=seed).select(range(keep))
    return _first(ds, data.max_train_samples)


def _first(ds: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return ds if limit is None or limit >= len(ds) else ds.select(range(limit))


def tokenize(splits: Splits, tokenizer: PreTrainedTokenizerBase, task: TaskConfig,
             max_seq_length: int) -> Splits:
    """Token ids, attention masks and ``labels`` (test splits keep ``idx`` for the predictions).

    ``datasets`` caches the result next to data that lives on disk (the Hub's, local files),
    keyed by the data, the tokenizer and these arguments, so the next run reads it back."""

    def encode(batch: Dict[str, list]) -> Dict[str, list]:
        texts = [batch[name] for name in task.text_fields]
        encoded = tokenizer(*texts, truncation=True, max_length=max_seq_length)
        encoded["labels"] = [float(x) for x in batch["label"]] if task.is_regression else batch["label"]
        # Fast tokenizers keep what truncation cut off; slow ones only tell by the length.
        encoded["truncated"] = ([bool(e.overflowing) for e in encoded.encodings] if encoded.encodings
                                else [len(ids) >= max_seq_length for ids in encoded["input_ids"]])
        return encoded

    def apply(ds: datasets.Dataset, name: str, keep: tuple[str, ...] = ()) -> datasets.Dataset:
        drop = [column for column in ds.column_names if column not in keep]
        ds = ds.map(encode, batched=True, remove_columns=drop, desc=f"tokenize {name}")
        truncated = sum(ds["truncated"])
        if truncated:
            log.info("%s: %d of %d examples (%.1f%%) truncated at data.max_seq_length=%d", name, truncated,
                     len(ds), 100 * truncated / len(ds), max_seq_length)
        return ds.remove_columns("truncated")

    return Splits(train=apply(splits.train, "train"),
                  eval={name: apply(ds, name) for name, ds in splits.eval.items()},
                  test={name: apply(ds, name, keep=("idx",)) for name, ds in splits.test.items()})


class EpochSampler(Sampler[int]):
    """A new random order every epoch, fixed by the seed and the epoch, that can start part-way
    through an epoch (after a resume) without reading the examples it skips."""

    def __init__(self, size: int, *, seed: int) -> None:
        self.size, self.seed = size, seed
        self.epoch, self.start = 0, 0

    def set_epoch(self, epoch: int, *, start: int = 0) -> None:
        self.epoch, self.start = epoch, start

    def __iter__(self) -> Iterator[int]:
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        return iter(order[self.start:].tolist())

    def __len__(self) -> int:
        return max(self.size - self.start, 0)


def train_loader(ds: datasets.Dataset, collator: DataCollatorWithPadding, *, micro_batch_size: int, seed: int,
                 num_workers: int, pin_memory: bool) -> Tuple[DataLoader, EpochSampler]:
    """Shuffled micro-batches, and the sampler that sets each epoch's order."""
    sampler = EpochSampler(len(ds), seed=seed)
    # The loader's own generator seeds its workers, so that it never draws from the global
    # generator: dropout must see the same random numbers whether or not the run resumed.
    loader = DataLoader(ds, batch_size=micro_batch_size, sampler=sampler, collate_fn=collator,
                        num_workers=num_workers, pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed))
    return loader, sampler


def eval_loader(ds: datasets.Dataset, collator: DataCollatorWithPadding, *, batch_size: int,
                num_workers: int, pin_memory: bool) -> DataLoader:
    return DataLoader(ds, batch_size=batch_size, sampler=SequentialSampler(ds),
                      collate_fn=collator, num_workers=num_workers, pin_memory=pin_memory)
