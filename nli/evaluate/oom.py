"""Out of GPU memory: a training step again in micro-batches of half the size, an evaluation again in
batches of half the size, instead of a run lost to a ``hw.per_device_batch_size`` one notch too big.

A training step whose micro-batch raises ``torch.OutOfMemoryError`` (forward or backward) is undone and
started again (:meth:`MicroBatches.back_off`): its gradients dropped, the random generators put back where
the step found them, the freed memory handed back to the device, and the micro-batch halved, with twice
the accumulation. Nothing else has moved: the optimizer, the schedule, the loss scaler and the progress
change only after a step's last micro-batch, so the step is neither lost nor counted twice.

The training is the same: the step takes the same global batch (``train.batch_size``), the same examples
in the same order, and weighs each micro-batch's mean loss by its share of the global batch, so its
gradient is the global batch's mean-loss gradient however the batch is cut. What the cut changes is the
order in which floats add up (two micro-batches' gradients summed instead of one; matrix products over
fewer rows; each micro-batch padded to its own longest example, which masked attention ignores up to
rounding): the weights match a run started at the smaller size to float tolerance, not bit for bit
in general. Dropout draws from the restored generators, so a step retried at the smaller size draws
what it would have drawn had the run started at that size; after earlier steps at the larger size the
stream has moved on differently, and the masks differ (in value, not in distribution).

The size that fits is kept in every checkpoint, and a resumed run starts at it, on any device, as long as
``hw.per_device_batch_size`` asks what it asked when the run backed off: a new value is taken as the
user's new choice (a bigger GPU, say). Under data parallelism the ranks cannot cheaply agree to cut a
step mid-way (the others wait in the gradient all-reduce), so a rank out of memory stops the run with a
message naming the size to set; its checkpoints are kept and the same command resumes it.

The optimizer's first step allocates its state (Adam's moments: 8 bytes a parameter): out of memory there, it
is tried once more with the memory freed (:func:`optimizer_step`); a micro-batch of another size would not help.

Evaluation (:class:`Evaluations`: the run's eval splits, eval.extra's sets, an evaluation-only run's)
halves its batches the same way, for the rest of the run, and so do the test splits' predictions
(:func:`fitting`); each example's prediction does not depend on its batch (the model is in eval mode),
so the metrics and predictions are the same up to float rounding. That size is not kept: a resumed run
finds it again in one failed batch.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import math
from typing import Callable, Dict, List, Optional, Tuple, TypeVar

import torch
from torch.utils.data import DataLoader

from nli.data.loaders import LengthGroups, Loader, release_workers
from nli.errors import OutOfMemory
from nli.evaluate.evaluation import Evaluation, Evaluator
from nli.runtime.device import Compute
from nli.runtime.distributed import World

log = logging.getLogger(__name__)
T = TypeVar("T")

_ADVICE = ("use a GPU with more memory, a smaller model, a shorter data.max_seq_length, train.gradient_checkpointing"
           "=true or precision=bf16")


class MicroBatches:
    """The micro-batch size that fits on this device: ``hw.per_device_batch_size``'s (``configured``), or less
    after an out-of-memory error. A part of every checkpoint (nli.train.checkpoint.TrainingState)."""

    def __init__(self, configured: int, compute: Compute, world: World) -> None:
        self.configured, self.size = configured, configured
        self.compute, self.world = compute, world
        self._rng: Optional[Tuple[torch.Tensor, Optional[torch.Tensor]]] = None

    def state_dict(self) -> Dict[str, int]:
        return {"configured": self.configured, "size": self.size}

    def load_state_dict(self, state: Dict[str, int]) -> None:
        if state["size"] >= state["configured"]:  # it never ran out of memory
            return
        if state["configured"] != self.configured:
            log.info("the run had backed off to micro-batches of %d (of %d asked); hw.per_device_batch_size now asks "
                     "%d: trying that", state["size"], state["configured"], self.configured)
            return
        self.size = state["size"]
        log.info("micro-batches of %d, the size that fit when the run ran out of memory in micro-batches of %d (set "
                 "another hw.per_device_batch_size to try a size again)", self.size, self.configured)

    def loader(self, loader: DataLoader) -> DataLoader:
        """``loader`` in micro-batches of the size that fits."""
        return loader if loader.batch_size == self.size else rebatched(loader, self.size)

    def begin_step(self) -> None:
        """Mark where the random generators stand as a step starts, to undo a failed attempt's draws. Cheap: a
        copy of the CPU generator's state and the GPU's seed and offset; no wait for the device."""
        cuda = torch.cuda.get_rng_state(self.compute.device) if self.compute.device.type == "cuda" else None
        self._rng = (torch.get_rng_state(), cuda)

    def back_off(self, loader: DataLoader, model: torch.nn.Module, *, global_batch: int) -> DataLoader:
        """After out of memory in one of a step's micro-batches: the step undone (its gradients dropped, the
        random generators as the step found them, the freed memory back to the device) and ``loader`` in
        micro-batches of about half the size (a divisor of this device's share of the global batch, so that
        they still add up to it). Call it outside the ``except`` clause: the error's traceback holds the
        step's tensors until then."""
        size = loader.batch_size or 1
        per_device = global_batch // self.world.world_size
        smaller = _half(size, per_device)
        if self.world.distributed:
            raise OutOfMemory(f"rank {self.world.rank} of {self.world.world_size} ran out of GPU memory in a micro-"
                              f"batch of {size} examples; under data parallelism the ranks cannot agree on a smaller "
                              "one in the middle of a step, so the run stops, its checkpoints kept. Set "
                              f"hw.per_device_batch_size={smaller or 1} and start it again: it resumes from its "
                              "newest checkpoint")
        if smaller is None:
            raise OutOfMemory("out of GPU memory with a single example per micro-batch: no hw.per_device_batch_size "
                              f"fits. The run stopped, its checkpoints kept; {_ADVICE}, then start it again")
        model.zero_grad(set_to_none=True)
        free(self.compute)
        if self._rng is not None:
            torch.set_rng_state(self._rng[0])
            if self._rng[1] is not None:
                torch.cuda.set_rng_state(self._rng[1], self.compute.device)
        self.size = smaller
        log.warning("out of GPU memory in a micro-batch of %d examples: going on in micro-batches of %d, %d "
                    "accumulated per optimizer step, the same global batch of %d in the same order, so the same "
                    "training (hw.per_device_batch_size=%d starts there; the checkpoints keep it)", size, smaller,
                    math.ceil(per_device / smaller), global_batch, smaller)
        return rebatched(loader, smaller)


class Evaluations:
    """An evaluator whose batches halve, for the rest of the run, each time one does not fit in memory."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator
        self._earlier: List[Evaluator] = []  # the evaluators of larger batches it replaced

    def made(self, evaluation: Optional[Evaluation]) -> bool:
        """Whether ``evaluation`` is one made in this process, in batches of any size (Evaluator.made)."""
        return any(each.made(evaluation) for each in (self.evaluator, *self._earlier))

    def batch_size(self) -> int:
        """The largest batch its evaluations now take: the size that fitted, where one did not."""
        return max((batch_size(loader) for loader in self.evaluator.loaders.values()), default=1)

    def examples_per_second(self) -> Optional[float]:
        """How fast its evaluations predicted, in the batches that fit (Evaluator.examples_per_second)."""
        return self.evaluator.examples_per_second()

    def __call__(self, model: torch.nn.Module, step: int) -> Evaluation:
        training = model.training  # a failed pass leaves the model in eval mode: training goes on with dropout
        # Each pass over a loader draws its iterator's seed from torch's generator: a failed pass must not
        # leave one more draw behind it, or every later step's dropout differs from a run that fit at once.
        rng = torch.get_rng_state()
        while True:
            try:
                return self.evaluator(model, step)
            except torch.OutOfMemoryError:
                pass  # handled outside the except clause, whose traceback holds the batch's tensors
            finally:
                model.train(training)
            torch.set_rng_state(rng)
            self._earlier.append(self.evaluator)
            self.evaluator = self._halved()

    def _halved(self) -> Evaluator:
        size = self.batch_size()
        _make_room(size, self.evaluator.compute, self.evaluator.world, doing="evaluating")
        log.warning("out of GPU memory evaluating batches of %d examples: evaluating in batches of %d from now on, "
                    "with the same metrics (train.eval_batch_size=%d starts there)", size, size // 2, size // 2)
        loaders = {name: rebatched(loader, max(batch_size(loader) // 2, 1))
                   for name, loader in self.evaluator.loaders.items()}
        return dataclasses.replace(self.evaluator, loaders=loaders)


def fitting(run: Callable[[DataLoader], T], loader: DataLoader, compute: Compute, world: World) -> Tuple[T, int]:
    """``run(loader)`` (a forward-only pass: the test splits' predictions), again in batches of half the size
    each time one does not fit in memory; with the batch size that fitted. Each example's prediction does
    not depend on its batch, and nothing random is drawn after it."""
    while True:
        try:
            return run(loader), batch_size(loader)
        except torch.OutOfMemoryError:
            pass  # handled outside the except clause, whose traceback holds the batch's tensors
        size = batch_size(loader)
        _make_room(size, compute, world, doing="predicting")
        log.warning("out of GPU memory predicting in batches of %d examples: predicting in batches of %d "
                    "(train.eval_batch_size=%d starts there)", size, size // 2, size // 2)
        loader = rebatched(loader, max(size // 2, 1))


def optimizer_step(optimizer: torch.optim.Optimizer, scaler: torch.amp.GradScaler, compute: Compute) -> None:
    """``scaler.step(optimizer)``; where its first step runs out of memory allocating the optimizer's state (Adam's
    two moments, 8 bytes a parameter, beside the weights and gradients), once more with that state dropped and the
    memory freed: what failed there is often a cache the backward pass left fragmented. A fused optimizer (the
    default) allocates its state before it moves any weight, so the step is the one it would have been. Any other
    out-of-memory error in the optimizer (a later step, one not fused, which may have moved some tensors) stops
    the run in one line, its checkpoints kept."""
    first = not optimizer.state
    try:
        scaler.step(optimizer)
        return
    except torch.OutOfMemoryError:
        pass  # handled outside the except clause, whose traceback holds the tensors it allocated
    fused = all(group.get("fused") for group in optimizer.param_groups)
    if first and fused:
        optimizer.state.clear()  # as it was before the step: none
        for name in ("grad_scale", "found_inf"):  # the scaler's word to a fused step, left by the failed one:
            if hasattr(optimizer, name):  # the retry would multiply its scale by that one (2^32 for fp16's 2^16)
                delattr(optimizer, name)
        free(compute)
        log.warning("out of GPU memory allocating the optimizer's state in its first step: trying once more with "
                    "the freed memory")
        try:
            scaler.step(optimizer)
            return
        except torch.OutOfMemoryError:
            pass
    size = sum(p.numel() for group in optimizer.param_groups for p in group["params"])
    raise OutOfMemory(f"out of GPU memory in the optimizer's step: its state ({size:,} parameters' worth of "
                      f"{type(optimizer).__name__} moments) does not fit beside the model and its gradients"
                      f"{'' if fused else ' (optimizer.fused=true takes less: no temporary copies)'}. The run stopped, "
                      f"its checkpoints kept; {_ADVICE} or model/peft=lora, then start it again")


def at_most(loader: DataLoader, size: int) -> DataLoader:
    """``loader``, in batches of at most ``size`` examples."""
    return rebatched(loader, size) if batch_size(loader) > size else loader


def _make_room(size: int, compute: Compute, world: World, *, doing: str) -> None:
    """Ready for batches half of ``size`` after an out-of-memory error, or an OutOfMemory that says why not
    and what to set."""
    if world.distributed:
        raise OutOfMemory(f"rank {world.rank} of {world.world_size} ran out of GPU memory {doing} batches of {size} "
                          "examples; under data parallelism the ranks cannot agree on smaller ones mid-way, so the "
                          f"run stops, its checkpoints kept. Set train.eval_batch_size={max(size // 2, 1)} and start "
                          "it again: it resumes from its newest checkpoint")
    if size == 1:
        raise OutOfMemory(f"out of GPU memory {doing} a single example: no train.eval_batch_size fits. The run "
                          f"stopped, its checkpoints kept; {_ADVICE}, then start it again")
    free(compute)


def free(compute: Compute) -> None:
    """Hand what a failed attempt held back to the device: unreachable tensors collected, the CUDA cache
    emptied, so that the smaller attempt does not find the memory fragmented."""
    gc.collect()
    if compute.device.type == "cuda":
        torch.cuda.empty_cache()


def batch_size(loader: DataLoader) -> int:
    """Examples per batch: the loader's, or its length groups' (an evaluation's: nli.data.loaders.LengthGroups)."""
    groups = loader.batch_sampler
    return groups.batch_size if isinstance(groups, LengthGroups) else loader.batch_size or 1


def rebatched(loader: DataLoader, batch_size: int) -> DataLoader:
    """The same data in the same order (the same sampler, or the same length groups) in batches of
    ``batch_size``, loaded as ``loader`` loads them. It replaces ``loader``: the workers that one kept end."""
    groups = loader.batch_sampler
    batches = (dict(batch_sampler=groups.rebatched(batch_size)) if isinstance(groups, LengthGroups) else
               dict(batch_size=batch_size, sampler=loader.sampler, generator=loader.generator))
    smaller = Loader(loader.dataset, **batches, collate_fn=loader.collate_fn, num_workers=loader.num_workers,
                     pin_memory=loader.pin_memory, persistent_workers=loader.persistent_workers,
                     worker_init_fn=loader.worker_init_fn,
                     prefetch_factor=loader.prefetch_factor if loader.num_workers else None)
    release_workers(loader)
    return smaller


def _half(size: int, per_device: int) -> Optional[int]:
    """About half of ``size``: the largest divisor of ``per_device`` (this device's share of the global
    batch, which the micro-batches must add up to) no bigger than half of it; None for 1. An odd size
    does not fall to 1 (7 of 28: 2; of 14: 2, not 1)."""
    return next((d for d in range(size // 2, 0, -1) if per_device % d == 0), None)
