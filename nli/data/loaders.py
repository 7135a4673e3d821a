"""Load a task's splits, tokenize them once, and batch them with dynamic padding (on XLA, padding to a
few fixed lengths: :class:`BucketPadding`)."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import math
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, NamedTuple, Optional, Sequence

import datasets
import numpy as np
import pyarrow
import pyarrow.compute
import torch
from torch.utils.data import DataLoader, Sampler, SequentialSampler
from transformers import DataCollatorWithPadding, PreTrainedTokenizerBase

from nli.config.schema import DIAGNOSTIC_SPLIT, DataConfig, TaskConfig
from nli.data import sources
from nli.errors import DataError
from nli.runtime.distributed import World, shard
from nli.runtime.signals import end_workers_at_exit, shelter_worker, workers_forking

log = logging.getLogger(__name__)

# Examples (tokenized features) -> a batch of tensors: DataCollatorWithPadding, or BucketPadding on XLA.
Collator = Callable[[List[Dict[str, Any]]], Dict[str, torch.Tensor]]


@dataclass
class Splits:
    """Per split: the task's text columns, ``label``, ``idx`` and its ``groups`` columns (raw), or model
    inputs (tokenized)."""

    train: Optional[datasets.Dataset]  # None in an evaluation-only run: it reads no training set
    eval: Dict[str, datasets.Dataset]
    test: Dict[str, datasets.Dataset] = field(default_factory=dict)  # only when predicting
    # eval split -> each of task.groups -> its value for each example (tokenizing drops the columns)
    groups: Dict[str, Dict[str, List[str]]] = field(default_factory=dict)
    notes: List[str] = field(default_factory=list)  # what a run asked for and will not get: its warnings

    def train_texts(self, text_fields: List[str]) -> Iterator[str]:
        assert self.train is not None, "a tokenizer is learnt from a training set"
        for name in text_fields:
            yield from self.train[name]

    def train_contents(self, text_fields: List[str]) -> Contents:
        """What a resumed run checks its training set against (:func:`contents_of`)."""
        assert self.train is not None, "an evaluation-only run reads no training set"
        return contents_of(self.train, text_fields)

    def eval_contents(self, split: str, text_fields: List[str]) -> Contents:
        """What a resumed run checks eval split ``split`` against (:func:`contents_of`): its examples as scored,
        the first data.max_eval_samples of them."""
        return contents_of(self.eval[split], text_fields)


def load_splits(task: TaskConfig, data: DataConfig, *, seed: int, predict: bool, train: bool = True,
                dir_key: str = "data.dir") -> Splits:
    """The training split (unless ``train`` is false), every evaluation split and, to ``predict``, the
    test splits of ``task`` with GLUE's diagnostic set where it has one (a note where it is not at hand),
    subsampled as ``data`` asks; examples without a gold label (SNLI's) left out of training and
    evaluation. ``dir_key`` names the key that set ``data.dir``, for the messages."""
    test_splits = list(task.test_splits) if predict else []
    notes: List[str] = []  # what a run asked for and will not get, or got otherwise: its warnings
    raw = sources.load(task, data, [*([task.train_split] if train else []), *task.eval_splits, *test_splits],
                       dir_key=dir_key, notes=notes)
    train_set = None
    if train:
        train_set = _subsample_train(_gold(raw[task.train_split], task, task.train_split), data, seed=seed)
    gold = {split: _gold(raw[split], task, split) for split in task.eval_splits}
    evals = {split: _first(ds, data.max_eval_samples) for split, ds in gold.items()}
    for split in task.eval_splits:
        _warn_groups_left_out(task, split, gold[split], evals[split])
    groups = {split: {column: ds[column] for column in task.groups} for split, ds in evals.items()} \
        if task.groups else {}
    test = {split: raw[split] for split in test_splits}
    notes += _diagnostic(task, data, test) if predict and task.diagnostic is not None else []
    if train_set is not None and not task.is_regression:
        notes += _labels_not_trained(task, train_set, evals)
    if train_set is not None:
        notes += _trained_on(task, data)
    sizes = ", ".join(f"{name}={len(ds)}" for name, ds in evals.items()) + \
        "".join(f"; test {name}={len(ds)}" for name, ds in test.items())
    if train_set is not None:
        log.info("data: %d training examples; eval %s", len(train_set), sizes)
    else:
        log.info("data: %s, no training set; eval %s", task.name, sizes)
    return Splits(train=train_set, eval=evals, test=test, groups=groups, notes=notes)


def _diagnostic(task: TaskConfig, data: DataConfig, test: Dict[str, datasets.Dataset]) -> List[str]:
    """GLUE's diagnostic set added to ``test``; where it is not at hand, the note that says so."""
    assert task.diagnostic is not None
    found, why = sources.diagnostic(task, data)
    if found is not None:
        test[DIAGNOSTIC_SPLIT] = found
        return []
    return [f"{task.diagnostic.submission}.tsv, the predictions on GLUE's diagnostic set that a GLUE submission "
            f"takes from the {task.name} model, will not be written: {why}"]


def _trained_on(task: TaskConfig, data: DataConfig) -> List[str]:
    """A note for each eval split that data.files reads from the training file: its score, on examples the model
    learnt, was reported as the model's with no word of it."""
    if task.train_split not in data.files:
        return []
    train = sources.same_file_key(data.files[task.train_split])
    return [f"data.files.{split}={data.files[split]} is the training file: its score is on examples the model trained "
            "on, and says nothing of how it does on others. Give it a file of examples held out of training"
            for split in task.eval_splits if split in data.files and sources.same_file_key(data.files[split]) == train]


def _labels_not_trained(task: TaskConfig, train: datasets.Dataset, evals: Dict[str, datasets.Dataset]) -> List[str]:
    """A note for each eval split with labels the training set has no example of (a train file without a class, one
    whose labels were written otherwise, a subsample too small): the model cannot learn them, and it trained and
    scored with no word of why it never predicts them."""
    trained = set(pyarrow.compute.unique(train.with_format("arrow")["label"]).to_pylist())
    notes = []
    for split, ds in evals.items():
        counts = pyarrow.compute.value_counts(ds.with_format("arrow")["label"]).to_pylist()
        absent = sorted((c["values"], c["counts"]) for c in counts if c["values"] not in trained)
        if absent:
            named = ", ".join(f"{task.label_names[label]} ({n} of {len(ds)})" for label, n in absent)
            notes.append(f"{task.name}: the training set ({len(train)} examples) has no example labelled {named}, "
                         f"which {split} has: the model cannot learn to predict it. Check the training file's labels, "
                         "or train on more of it (data.max_train_samples, data.fraction_of_train_data)")
    return notes


def _gold(ds: datasets.Dataset, task: TaskConfig, split: str) -> datasets.Dataset:
    """The examples that have a gold label: the Hub's -1 (SNLI's pairs without a consensus, "-" in its
    files) can be neither learnt nor scored. How many were left out is logged."""
    if task.is_regression:
        return ds
    labels = ds.with_format("arrow")["label"]
    missing = int(pyarrow.compute.sum(pyarrow.compute.equal(labels, sources.NO_LABEL)).as_py() or 0)
    if not missing:
        return ds
    if missing == len(ds):
        raise DataError(f"task {task.name}: none of the {len(ds)} examples of its {split} split has a gold "
                                "label (all are -1): a split to train or evaluate on needs labels")
    log.info("%s %s: %d of %d examples have no gold label (label -1%s) and are left out", task.name, split,
             missing, len(ds), f", {task.no_gold_label!r} in the original files" if task.no_gold_label else "")
    return ds.filter(lambda labels: [label != sources.NO_LABEL for label in labels], input_columns="label",
                     batched=True, desc=f"drop {task.name} {split} examples without a gold label")


def _subsample_train(ds: datasets.Dataset, data: DataConfig, *, seed: int) -> datasets.Dataset:
    if data.fraction_of_train_data < 1:
        keep = math.ceil(data.fraction_of_train_data * len(ds))
        ds = ds.shuffle(seed=seed).select(range(keep))
    return _first(ds, data.max_train_samples)


def _warn_groups_left_out(task: TaskConfig, split: str, whole: datasets.Dataset, kept: datasets.Dataset) -> None:
    """A warning where data.max_eval_samples, which keeps a split's first examples, leaves out every example of
    some value of a task.groups column: a file ordered by heuristic, as HANS's is, gave the accuracy of its first
    heuristic under the set's name, and no word of the others."""
    if len(kept) == len(whole):
        return
    for column in task.groups:
        left_out = sorted(set(whole[column]) - set(kept[column]))
        if left_out:
            log.warning("%s %s: data.max_eval_samples=%d keeps its first %d of %d examples, and none of %s %s: its "
                        "accuracy is not the whole set's. Set data.max_eval_samples=null to score them all",
                        task.name, split, len(kept), len(kept), len(whole), column, ", ".join(left_out))


def _first(ds: datasets.Dataset, limit: int | None) -> datasets.Dataset:
    return ds if limit is None or limit >= len(ds) else ds.select(range(limit))


class Contents(NamedTuple):
    """Digests of a set's examples (:func:`contents_of`): of their text, and of their labels."""

    text: str
    labels: str

    def differs_from(self, other: Contents) -> Optional[str]:
        """What differs between these examples and ``other``'s; None where nothing does, or where either is not
        known (a checkpoint from before the digests were kept: "")."""
        if not (self.text and other.text) or self == other:
            return None
        if self.labels == other.labels:
            return "their text differs, their labels do not"
        if self.text == other.text:
            return "their labels differ, their text does not"
        return "their text and labels differ: other examples, or the same ones in another order"


def check_same_everywhere(world: World, sets: Dict[str, Contents]) -> None:
    """Stop every process of a run where one read ``sets`` (a name -> its examples' digests) other than process 0's.
    Each process reads the data from its own machine (data.dir, data.files, the Hub's cache): copies that differ
    trained each process on other examples under one order, each scoring its own share of another eval set, with no
    word. Every process learns every other's digests, so all stop together, with one message."""
    said = world.gather(sets)
    for name, ours in said[0].items():
        other = next(((rank, got[name]) for rank, got in enumerate(said) if got[name] != ours), None)
        if other is not None:
            rank, theirs = other
            raise DataError(f"process {rank} of the run read a {name} other than process 0's "
                            f"({theirs.differs_from(ours)}): each machine reads its own copy of the data (data.dir, "
                            "data.files, or the Hub's cache), and the copies differ. Make them the same (compare the "
                            "files with sha256sum), or give every machine one copy (a shared disk, or a bucket: "
                            "data.dir=gs://...)")


# Examples hashed at a time: a selection out of the set's order (data.fraction_of_train_data) is copied piece by
# piece to be hashed, never whole.
_PIECE = 65_536


def contents_of(ds: datasets.Dataset, text_fields: Sequence[str]) -> Contents:
    """What a resumed run checks its training set and its main eval split against (nli.train.loop): their examples'
    text (``text_fields``) and labels, example by example in the set's order, as loaded. Of the values alone: not
    of the file they came from (its path, its time), of how arrow holds them (chunks, a selection's indices), of the
    tokenizer, or of the processes (each holds the whole set). 0.1 s for MNLI's 393k examples; 2 s where they are a
    selection out of the file's order (data.fraction_of_train_data), which ``datasets`` gathers example by example."""
    columns = {name: _ColumnHash() for name in [*text_fields, "label"]}
    for piece in ds.select_columns(list(columns)).with_format("arrow").iter(batch_size=_PIECE):
        piece = piece.combine_chunks()  # a piece gathered out of order comes as one chunk per example
        for name, hashed in columns.items():
            for chunk in piece[name].chunks:
                hashed.update(chunk)
    text = hashlib.sha256(b"".join(columns[name].digest() for name in text_fields))
    return Contents(text=text.hexdigest()[:16], labels=hashlib.sha256(columns["label"].digest()).hexdigest()[:16])


class _ColumnHash:
    """A column hashed as one stream, whatever pieces and chunks it comes in: each string's length and its bytes in
    hashes of their own (where one string ends and the next begins counts), numbers as 64-bit ones (a label's type
    differs by source: int64, float32 or float64)."""

    def __init__(self) -> None:
        self.lengths, self.values = hashlib.sha256(), hashlib.sha256()

    def update(self, values: pyarrow.Array) -> None:
        if not len(values):
            return
        if pyarrow.types.is_string(values.type) or pyarrow.types.is_large_string(values.type):
            _, offsets, data = values.buffers()
            width = np.int64 if pyarrow.types.is_large_string(values.type) else np.int32
            ends = np.frombuffer(offsets, dtype=width)[values.offset:values.offset + len(values) + 1]
            self.lengths.update(np.diff(ends).astype(np.int64).tobytes())
            if data is not None:  # none where every string is empty
                self.values.update(memoryview(data)[int(ends[0]):int(ends[-1])])
        else:
            numbers = values.to_numpy(zero_copy_only=False)
            self.values.update(numbers.astype(np.float64 if numbers.dtype.kind == "f" else np.int64).tobytes())

    def digest(self) -> bytes:
        return self.lengths.digest() + self.values.digest()


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

    return Splits(train=apply(splits.train, "train") if splits.train is not None else None,
                  eval={name: apply(ds, name) for name, ds in splits.eval.items()},
                  test={name: apply(ds, name, keep=("idx",)) for name, ds in splits.test.items()},
                  groups=splits.groups, notes=splits.notes)


class EpochSampler(Sampler[int]):
    """A new random order every epoch, fixed by the seed and the epoch, that can start part-way
    through an epoch (after a resume) without reading the examples it skips.

    Under data parallelism every rank draws the same order and cuts it into global batches of
    ``batch_size``; rank r takes the r-th contiguous slice of each (``distributed.shard``), so the
    ranks together see, step for step, exactly the batch one process would. A full batch splits
    into equal slices of whole micro-batches; the epoch's last, shorter batch into slices that
    differ by one example at most. ``start`` counts the examples of the epoch already trained on
    by all ranks together: a whole number of global batches, whatever the world size.

    With ``bucket`` > 0 and the examples' ``lengths``, batches hold examples of about one length
    (``_draw``): far less padding, the same reproducible order for a seed and an epoch."""

    def __init__(self, size: int, *, seed: int, batch_size: int, rank: int = 0, world_size: int = 1,
                 lengths: Optional[Sequence[int]] = None, bucket: int = 0) -> None:
        self.size, self.seed, self.batch_size, self.rank, self.world_size = size, seed, batch_size, rank, world_size
        self.lengths = lengths if lengths is not None else [0] * size  # real (non-pad) tokens per example
        self.bucket = bucket
        self.epoch, self.start = 0, 0
        self._orders: Dict[int, List[int]] = {}

    def set_epoch(self, epoch: int, *, start: int = 0) -> None:
        if start and start >= self.size:
            # A resumed run's place in its epoch, past the end of a training set that shrank since its checkpoint:
            # the epoch held no batch, and the loop waited on one for ever, deaf to a signal to stop.
            raise DataError(f"the run's checkpoint is {start} examples into an epoch, and its training set now has "
                            f"{self.size}: the training data changed since the checkpoint was written (data.dir's or "
                            "data.files' training file). Put the training data back as it was, or start the run "
                            "afresh in another output_dir")
        self.epoch, self.start = epoch, start

    def step_examples(self, done: int) -> int:
        """Examples in the global batch that starts after ``done`` examples of the epoch."""
        return min(self.batch_size, self.size - done)

    def share(self, done: int) -> int:
        """This rank's examples of the global batch that starts after ``done``."""
        lo, hi = shard(self.step_examples(done), rank=self.rank, world_size=self.world_size)
        return hi - lo

    def step_tokens(self, done: int) -> int:
        """Real tokens of the global batch that starts after ``done``: every rank knows them
        without asking the others or the device."""
        order = self.order()
        return int(sum(self.lengths[i] for i in order[done:done + self.step_examples(done)]))

    def order(self) -> List[int]:
        """The epoch's order, a function of the seed and the epoch alone."""
        if self.epoch not in self._orders:
            self._orders = {self.epoch: self._draw()}
        return self._orders[self.epoch]

    def _draw(self) -> List[int]:
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(self.size, generator=generator).tolist()
        if not self.bucket:
            return order
        # Length buckets: each run of `bucket` global batches sorted by length, so that a batch (and
        # each rank's slice of it) holds examples of about one length and pads little; then the full
        # batches shuffled. Lengths count in bands of 8 tokens (what GPUs pad to anyway), and the
        # stable sort keeps the random order within a band: where length tells the label (a short
        # hypothesis, an entailment), a batch still mixes labels instead of holding one. The epoch's
        # last, short batch stays last, so positions still count whole batches and a resume finds its place.
        chunk = self.batch_size * self.bucket
        order = [i for c in range(0, self.size, chunk)
                 for i in sorted(order[c:c + chunk], key=lambda i: -math.ceil(self.lengths[i] / 8))]
        full = self.size // self.batch_size
        batches = torch.randperm(full, generator=generator).tolist()
        return [i for b in batches for i in order[b * self.batch_size:(b + 1) * self.batch_size]] + \
            order[full * self.batch_size:]

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        mine: List[int] = []
        for begin in range(self.start, self.size, self.batch_size):
            lo, hi = shard(self.step_examples(begin), rank=self.rank, world_size=self.world_size)
            mine.extend(order[begin + lo:begin + hi])
        return iter(mine)

    def __len__(self) -> int:
        return sum(self.share(begin) for begin in range(self.start, self.size, self.batch_size))


class BucketPadding:
    """Pads each batch to the shortest of a few fixed lengths that holds it: powers of two from 16 up to
    ``max_length``, and ``max_length`` itself. XLA compiles a graph for each input shape it meets, so
    padding to the batch's longest sequence would compile one per length; these compile four at 128
    tokens, and pad no sequence to more than twice its length."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, max_length: int) -> None:
        self.lengths = bucket_lengths(max_length)
        self._pad = {n: DataCollatorWithPadding(tokenizer, padding="max_length", max_length=n) for n in self.lengths}

    def __call__(self, features: List[Dict[str, Any]]) -> Dict[str, torch.Tensor]:
        longest = max(len(f["input_ids"]) for f in features)
        return self._pad[next(n for n in self.lengths if n >= longest)](features)


def bucket_lengths(max_length: int) -> List[int]:
    lengths = [n for n in (2**k for k in range(4, max_length.bit_length())) if n < max_length]
    return [*lengths, max_length]


@dataclass(frozen=True)
class Batching:
    """How training batches are cut: ``size`` examples a step (the global batch, over every rank),
    ``micro_size`` a forward pass on each rank, grouped by length in buckets of ``bucket`` batches
    (``data.bucket``; 0: not grouped)."""

    size: int
    micro_size: int
    bucket: int = 0


class Loader(DataLoader):
    """A DataLoader whose sheltered workers (:func:`worker_init`) are forked with the run's signals held, so that
    none reaches a worker before it is sheltered (nli.runtime.signals.workers_forking). Workers are forked as
    its iterator starts: once for kept workers, at each pass otherwise."""

    def __iter__(self) -> Any:
        if self.num_workers == 0 or self.worker_init_fn is not shelter_worker:
            return super().__iter__()
        with workers_forking():
            return super().__iter__()


def release_workers(loader: DataLoader) -> None:
    """Ends the workers ``loader`` keeps between passes (persistent_workers), for a loader read no more (one
    replaced by smaller batches after an out-of-memory error): torch ends them only with the loader, and a run's
    data holds its first loaders to its end, each worker an idle process with its own memory until then."""
    iterator = getattr(loader, "_iterator", None)  # torch's: where a loader keeps its workers between passes
    if iterator is not None:
        iterator._shutdown_workers()
        loader._iterator = None


class TrainBatches(NamedTuple):
    """This rank's micro-batches of each global batch, and the sampler that sets each epoch's order."""

    loader: DataLoader
    sampler: EpochSampler


def train_loader(ds: datasets.Dataset, collator: Collator, batching: Batching, *, seed: int, world: World,
                 num_workers: int, pin_memory: bool) -> TrainBatches:
    """This rank's shuffled micro-batches of each global batch, and the sampler that sets each
    epoch's order (length-bucketed when ``batching.bucket`` > 0)."""
    lengths = pyarrow.compute.list_value_length(ds.with_format("arrow")[:]["input_ids"]).to_pylist()
    sampler = EpochSampler(len(ds), seed=seed, batch_size=batching.size, rank=world.rank, world_size=world.world_size,
                           lengths=lengths, bucket=batching.bucket)
    # The loader's own generator seeds its workers, so that it never draws from the global
    # generator: dropout must see the same random numbers whether or not the run resumed.
    # Workers that stay from epoch to epoch: none is started again at each.
    loader = Loader(ds, batch_size=batching.micro_size, sampler=sampler, collate_fn=collator,
                    num_workers=num_workers, pin_memory=pin_memory, generator=torch.Generator().manual_seed(seed),
                    persistent_workers=num_workers > 0, worker_init_fn=worker_init(num_workers))
    return TrainBatches(loader, sampler)


@dataclass(frozen=True)
class Workers:
    """How an evaluation's batches are loaded: ``count`` DataLoader worker processes (data.num_workers as the
    device takes it), into pinned memory for a CUDA device, and ``keep``: started at the first evaluation and
    kept for the next (forking them for each evaluation cost more than a dev set's few batches gained). Kept
    only where the model's weights are not in this process's memory: a kept worker keeps, copy-on-write, every
    page the training changes after its fork."""

    count: int = 0
    pin_memory: bool = False
    keep: bool = False

    @classmethod
    def on(cls, device_type: str, count: int) -> "Workers":
        return cls(count, pin_memory=device_type == "cuda", keep=count > 0 and device_type != "cpu")


def worker_init(count: int) -> Optional[Callable[[int], None]]:
    """The ``worker_init_fn`` of a loader with ``count`` workers: signals meant for the run leave them be
    (nli.runtime.signals.shelter_worker), and the process ends those still alive at its exit."""
    if count == 0:
        return None
    end_workers_at_exit()
    return shelter_worker


def eval_loader(ds: datasets.Dataset, collator: Collator, *, batch_size: int, world: World,
                workers: Workers = Workers(), grouped: bool = True) -> DataLoader:
    """This rank's contiguous slice of ``ds``: the ranks' predictions, each put back in the slice's
    order (:func:`in_split_order`) and gathered in rank order, are the split's in its own order, each
    example once. ``grouped``: in batches of about one length (:class:`LengthGroups`), which pad far
    less than batches in the split's order; else in that order."""
    lo, hi = world.shard(len(ds))
    ds = ds.select(range(lo, hi)) if (lo, hi) != (0, len(ds)) else ds
    if ds.features.get("idx") == datasets.Value("string"):  # a test file's own ids, as text
        collator = TextIds(collator)
    if grouped and len(ds):
        return Loader(ds, batch_sampler=LengthGroups(_lengths(ds), batch_size), collate_fn=collator,
                      num_workers=workers.count, pin_memory=workers.pin_memory, persistent_workers=workers.keep,
                      worker_init_fn=worker_init(workers.count))
    return Loader(ds, batch_size=batch_size, sampler=SequentialSampler(ds), collate_fn=collator,
                  num_workers=workers.count, pin_memory=workers.pin_memory, persistent_workers=workers.keep,
                  worker_init_fn=worker_init(workers.count))


def _lengths(ds: datasets.Dataset) -> List[int]:
    """Tokens per example, read from the Arrow column without decoding the examples."""
    return pyarrow.compute.list_value_length(ds.with_format("arrow")[:]["input_ids"]).to_pylist()


class LengthGroups(Sampler[List[int]]):
    """Batches of examples of about one length, longest first: an evaluation's batches, padded each to
    its longest example, then compute on little padding (the split's order mixes short and long).
    ``restore`` puts predictions made in this order back in the examples' own order."""

    def __init__(self, lengths: Sequence[int], batch_size: int) -> None:
        # Stable: examples of one length keep their order. Longest first: a batch too large for the
        # device's memory fails at once, not at the end of the split.
        self.order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
        self.batch_size = batch_size
        self.restore = [0] * len(self.order)  # restore[i]: where example i comes in the batches' order
        for position, example in enumerate(self.order):
            self.restore[example] = position

    def rebatched(self, batch_size: int) -> "LengthGroups":
        """The same order in batches of ``batch_size`` (an evaluation out of memory: nli.evaluate.oom)."""
        groups = copy.copy(self)
        groups.batch_size = batch_size
        return groups

    def __iter__(self) -> Iterator[List[int]]:
        for begin in range(0, len(self.order), self.batch_size):
            yield self.order[begin:begin + self.batch_size]

    def __len__(self) -> int:
        return -(-len(self.order) // self.batch_size)


def in_split_order(loader: DataLoader, values: Any) -> Any:
    """``values`` (a dataclass of arrays, one row per example, such as nli.evaluate.evaluation.Predictions)
    made in ``loader``'s order, in its examples' own order: each array whose first dimension counts
    the examples reordered, every other field as it is. Unchanged where the loader kept that order."""
    groups = loader.batch_sampler
    if not isinstance(groups, LengthGroups):
        return values
    restore = np.asarray(groups.restore, dtype=np.int64)
    changes = {f.name: value[restore] for f in dataclasses.fields(values)
               if isinstance(value := getattr(values, f.name), np.ndarray) and value.ndim
               and len(value) == len(restore)}
    return dataclasses.replace(values, **changes)


class TextIds:
    """A collator for examples whose ``idx`` is text (a test file's own ids): the ids pass beside the
    tensors, as a list, since a tensor holds numbers only."""

    def __init__(self, collator: Collator) -> None:
        self.collator = collator

    def __call__(self, features: List[Dict[str, Any]]) -> Dict[str, Any]:
        batch: Dict[str, Any] = self.collator([{k: v for k, v in f.items() if k != "idx"} for f in features])
        batch["idx"] = [f["idx"] for f in features]
        return batch


def collator(tokenizer: PreTrainedTokenizerBase, max_seq_length: int, device_type: str, *, compiled: bool) -> Collator:
    """How examples become a batch on ``device_type``: padded to the longest in the batch, or on XLA to a
    few bucket lengths (a graph compiled per input shape: a few lengths, not one per batch)."""
    if device_type == "xla":
        return BucketPadding(tokenizer, max_seq_length)
    # Multiples of 8 let fp16/bf16 tensor cores run at full speed, and leave a compiled model a
    # handful of shapes to compile for, not one per length; on the CPU they only add padding.
    pad = 8 if device_type == "cuda" or compiled else None
    return DataCollatorWithPadding(tokenizer, pad_to_multiple_of=pad)
