"""Will it fit? The peak GPU memory of one training process, for every GPU preset of conf/hw against every
recipe of conf/experiment that fine-tunes a pretrained model, at the preset's micro-batch and the recipe's
sequence length, in the precision ``precision=auto`` picks on that GPU, against the card's memory.

    python -m benchmarks.memory                         # the table (plain text); exits 1 if a row does not fit
    python -m benchmarks.memory --markdown              # as docs/distributed.md shows it
    python -m benchmarks.memory --json memory.json      # every figure, in bytes
    python -m benchmarks.memory --hw v100 t4 --experiment deberta-v3-large-mnli

Each row is what ``train.py experiment=RECIPE hw=PRESET`` composes (nli.config.command.compose, each recipe once, on
each preset): the micro-batch is ``Config.micro_batch_size``, ``hw.per_device_batch_size`` capped by the
process's share of ``train.batch_size``; the dtype is what ``precision=auto`` resolves to on the preset's GPU
(bf16 from compute capability 8.0, A100 and H100; fp16 on V100 and T4). A pair the config refuses (a global
batch smaller than the preset's GPUs) is listed under the table with the reason.

What a process holds, in bytes:

- params: 4 per weight (fp32 master weights; autocast computes in bf16/fp16 from them), frozen ones too.
- grads: 4 per trained weight (fp32, as the weights). Under ``model/peft=lora`` only the adapters and the
  head train, so the gradients and optimizer states are small.
- optim: Adam/AdamW 8 per trained weight (two fp32 moments); SGD 4 with momentum, else none.
- casts: autocast's bf16/fp16 copies of the weights that the backward needs (2 per weight of each matrix
  product), made in the forward pass and kept until the backward uses them. Measured, with the activations.
- activ.: the bytes autograd saves for the backward, measured (below).
- trans.: what the backward holds on top of the saved tensors, and the allocator's slack (below).
- context: what is not a tensor (below).

total is the static memory (params, grads, optim, context; under DDP the gradients are views into its
all-reduce buckets, nli.runtime.distributed, so the buckets take nothing more), the backward's allowance (trans.),
and the
largest of three moments that do not coincide: the start of the backward (casts, activ.); its end, where the
embeddings' new gradient is made before it is added to the one accumulated (4 bytes per weight of the largest
trained tensor; the activations are freed by then); the optimizer step (its temporaries, below).

How the activations are measured: the recipe's architecture (benchmarks/architectures.py: the Hub checkpoint's
shapes, built offline) at two depths, 1 + p and 1 + 2p layers, where p is the period of its layers' pattern
(1; ModernBERT 3: one global layer, two windowed), runs a training forward pass under ``torch.autocast`` in
the chosen dtype, on a batch of micro-batch examples, each ``max_seq_length`` tokens long (the worst case),
the attention mask present as in a padded batch. A ``torch.autograd.graph.saved_tensors_hooks`` hook counts
each saved tensor's storage once (a transposed query and the projection output it views are one storage; a
weight saved as itself is a parameter, not an activation), autocast's copies of weights apart. The difference
between the two depths is p layers' worth; the full depth is the shallower plus (layers - 1 - p) / p of them.
Under ``train.gradient_checkpointing`` each checkpointed layer keeps the inputs it was called with instead of
its saved tensors: they are counted as the layer receives them. The pass runs on fake tensors (torch's
FakeTensorMode: shapes and dtypes, no data, no arithmetic), so that 24 layers at 32 x 512 tokens count in a
fraction of a second; by the end of the forward pass autograd has saved all it will keep, so the backward is
not run. The tensors saved are those of the CPU's kernels, but for the three below.

What this cannot see, and what it does about it:

- CPU and CUDA kernels keep different tensors. Three differences are substituted while counting, as CUDA
  runs them (``--cpu-kernels`` counts the CPU's own instead, to see what they change): CUDA's fused SDPA
  kernels (flash, memory-efficient) keep queries, keys, values, the output, a float32 logsumexp per query, and
  the additive bias a boolean mask becomes, where the CPU's math kernel keeps the attention probabilities;
  CUDA's fused dropout keeps a 1-byte mask, the CPU's a mask in the input's dtype; CUDA's autocast runs
  softmax, log-softmax and layer norm in float32, the CPU's in the lower precision.
- The backward's transient peak: as it goes through a layer it holds that layer's gradients beside the saved
  tensors not yet freed; each has the shape of a tensor the layer made in the forward pass and is freed once
  used. One layer's saved bytes is allowed: measured with every live tensor counted (LiveTensors,
  tests/benchmarks/test_memory.py), the CPU's backward holds at most a quarter of a layer more; the rest is room
  for what CUDA's backward kernels allocate and the CPU's do not (flash attention's float32 accumulators, say). Under
  gradient checkpointing the backward first runs the layer again, keeping its saved tensors: two layers are
  allowed (measured: at most 1.2).
- The allocator's slack: the caching allocator rounds blocks up and, as batches change length, keeps freed
  blocks that the next shapes fit badly; 10% of the batch-dependent memory (casts, activ., the backward's
  transient) is allowed (``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` leaves less).
- The optimizer step's temporaries: fused Adam/AdamW (``optimizer.fused=true``, the default) makes none; the
  foreach kind makes one fp32 copy of the trained weights (the square root of the second moment), as does
  Nesterov SGD. The step runs after the backward has freed the activations.
- What is not a tensor: 0.75 GiB of CUDA context (the driver's context with lazily loaded kernels is some
  0.3-0.5 GiB, more on H100; then cuBLAS/cuBLASLt handles and workspaces, and the kernels a run loads), and
  0.5 GiB more for NCCL where the preset runs several processes (send and receive buffers per peer for each
  of up to 32 channels on NVLink machines, and NCCL's kernels).
- Not counted: model.fast_paths' first-token path computes the last layer of BERT-like models for one token
  (it saves less than counted: the table errs high); evaluation (``train.eval_batch_size``; no saved
  activations, and it halves its batch where it runs out of memory: docs/distributed.md).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import math
import sys
import weakref
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Set, Tuple

import torch
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
MIB, GIB = 2**20, 2**30

# What is not a tensor, and the allocator's slack (the module's docstring says why these sizes).
CONTEXT = 768 * MIB
NCCL = 512 * MIB
SLACK = 0.10  # of the batch-dependent memory
# The backward's transient peak over the saved tensors, in layers' worth of saved activations
# (tests/benchmarks/test_memory.py measures it on small models and checks that it stays under these).
BACKWARD_LAYERS = 1.0
CHECKPOINTED_LAYERS = 2.0


@dataclass(frozen=True)
class Card:
    name: str  # as the table prints it
    memory: int  # bytes: the total nvidia-smi reports for the card (the CUDA context comes out of it)


# By hw.gpu. The A100 presets are a2-highgpu machines, whose A100 has 40 GB (a2-ultragpu's has 80: no preset).
CARDS: Dict[str, Card] = {
    "V100": Card("V100 16 GB", 16160 * MIB),
    "T4": Card("T4 16 GB", 15360 * MIB),
    "A100": Card("A100 40 GB", 40960 * MIB),
    "H100": Card("H100 80 GB", 81559 * MIB),
}
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


# ------------------------------------------------------------------------------------ counting saved tensors


def storage_key(tensor: torch.Tensor) -> int:
    """Which storage ``tensor`` views: equal for a tensor and its views (transposes, reshapes, slices)."""
    return int(tensor.untyped_storage()._cdata)


class SavedTensors:
    """The bytes autograd keeps for the backward, each storage once however many saved tensors view it.
    Weights saved as themselves are left out (they are parameters); autocast's copies of weights are counted
    apart (:attr:`casts`). Every counted tensor stays referenced while the counter lives, so that no
    storage's key is reused by another while counting."""

    def __init__(self, weights: Set[int]) -> None:
        self.weights = weights  # storage keys of the parameters and buffers
        self.copies: Set[int] = set()  # storage keys of copies of weights (WeightCasts fills it)
        self.bytes: Dict[int, int] = {}  # storage key -> its size
        self._kept: List[torch.Tensor] = []

    def add(self, tensor: torch.Tensor) -> None:
        key = storage_key(tensor)
        if key not in self.weights and key not in self.bytes:
            self.bytes[key] = tensor.untyped_storage().nbytes()
            self._kept.append(tensor)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        """saved_tensors_hooks' pack hook: count, and let autograd keep the tensor as it would."""
        self.add(tensor)
        return tensor

    @property
    def casts(self) -> int:
        return sum(size for key, size in self.bytes.items() if key in self.copies)

    @property
    def activations(self) -> int:
        return sum(size for key, size in self.bytes.items() if key not in self.copies)


class WeightCasts(TorchDispatchMode):
    """Records, below autograd, the storage of every copy made of a weight (autocast's casts). Each copy stays
    referenced while counting: one freed at once (not saved) must not hand its key to an activation."""

    def __init__(self, counter: SavedTensors) -> None:
        super().__init__()
        self.counter = counter
        self._kept: List[torch.Tensor] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if func is torch.ops.aten._to_copy.default and storage_key(args[0]) in self.counter.weights:
            self.counter.copies.add(storage_key(out))
            self._kept.append(out)
        return out


class LiveTensors(TorchDispatchMode):
    """Every storage that ops make while active, counted until it is freed: the bytes alive now (:attr:`live`)
    and at most since :meth:`reset_peak` (:attr:`peak`). It sees the transient tensors that the saved-tensor
    count does not: what the backward's allowances are checked against (tests/benchmarks/test_memory.py). ``existing``:
    the storage keys of tensors made before (the weights), whose views are not new memory."""

    def __init__(self, existing: Iterable[int] = ()) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self._alive: Set[int] = set(existing)

    def reset_peak(self) -> None:
        self.peak = self.live

    def _freed(self, key: int, size: int) -> None:
        self.live -= size
        self._alive.discard(key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Tuple[Any, ...] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        from torch.utils._pytree import tree_leaves

        out = func(*args, **(kwargs or {}))
        for tensor in tree_leaves(out):
            if isinstance(tensor, torch.Tensor) and storage_key(tensor) not in self._alive:
                storage, key = tensor.untyped_storage(), storage_key(tensor)
                self._alive.add(key)
                self.live += storage.nbytes()
                weakref.finalize(storage, self._freed, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out


# --------------------------------------------------------------------------- CUDA's kernels, on the CPU


class _SavesAsFusedAttention(torch.autograd.Function):
    """Attention that keeps for the backward what CUDA's fused SDPA kernels keep: queries, keys, values, the
    output, a float32 logsumexp per query (rounded up to 32 queries, as the memory-efficient kernel keeps it),
    and the additive bias a boolean mask becomes. For counting only: its output and gradients are uninitialised
    tensors of the right shapes (computing them on the CPU would make the batch x heads x length x length
    probabilities that the fused kernels never make)."""

    @staticmethod
    def forward(ctx: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: Optional[torch.Tensor]) -> torch.Tensor:
        *batch, heads, length, _ = query.shape
        # (batch, heads, length, width) as a view of the (batch, length, heads, width) that CUDA's kernels write
        out = query.new_empty((*batch, length, heads, value.shape[-1])).transpose(-2, -3)
        logsumexp = query.new_empty((*batch, heads, 32 * math.ceil(length / 32)), dtype=torch.float32)
        kept = [query, key, value, out, logsumexp]
        if mask is not None:
            kept.append(query.new_empty(mask.shape) if mask.dtype == torch.bool else mask)
        ctx.save_for_backward(*kept)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Tuple[Optional[torch.Tensor], ...]:
        query, key, value = ctx.saved_tensors[:3]
        return torch.empty_like(query), torch.empty_like(key), torch.empty_like(value), None


def _fused_attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attn_mask: Optional[torch.Tensor] = None, dropout_p: float = 0.0, is_causal: bool = False,
                     scale: Optional[float] = None, enable_gqa: bool = False) -> torch.Tensor:
    if is_causal or enable_gqa:  # not in these encoders: the CPU's own kernel
        return F.scaled_dot_product_attention(query, key, value, attn_mask=attn_mask, dropout_p=dropout_p,
                                              is_causal=is_causal, scale=scale, enable_gqa=enable_gqa)
    if torch.is_autocast_enabled("cpu"):  # CUDA's autocast runs SDPA in the lower precision
        dtype = torch.get_autocast_dtype("cpu")
        query, key, value = (tensor.to(dtype) for tensor in (query, key, value))
    return _SavesAsFusedAttention.apply(query, key, value, attn_mask)  # dropout keeps a seed, not a mask


def _fused_dropout(input: torch.Tensor, p: float = 0.5, training: bool = True, inplace: bool = False) -> torch.Tensor:
    """CUDA's dropout (``native_dropout``) keeps a boolean mask; the CPU's multiplies by one of the input's dtype."""
    if not training or not 0 < p < 1 or inplace:
        return F.dropout(input, p, training, inplace)
    return torch.native_dropout(input, p, True)[0]


# CUDA's autocast runs these in float32 (torch.amp's "CUDA ops that can autocast to float32", those these
# encoders call); the CPU's runs them in the lower precision, and would keep half the bytes.
_CUDA_FLOAT32 = {F.softmax, F.log_softmax, F.layer_norm, F.group_norm, F.cross_entropy, F.nll_loss, F.mse_loss,
                 torch.softmax, torch.log_softmax, torch.layer_norm, torch.Tensor.softmax, torch.Tensor.log_softmax}


def _to_float32(value: Any) -> Any:
    return value.float() if isinstance(value, torch.Tensor) and value.is_floating_point() else value


class CudaKernels(TorchFunctionMode):
    """While active, attention, dropout and autocast's float32 ops keep for the backward what CUDA's kernels
    keep (the module's docstring lists them); everything else runs as it is."""

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: Sequence[Any] = (),
                           kwargs: Optional[Dict[str, Any]] = None) -> Any:
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention:
            return _fused_attention(*args, **kwargs)
        if func is F.dropout:
            return _fused_dropout(*args, **kwargs)
        if func in _CUDA_FLOAT32 and torch.is_autocast_enabled("cpu"):
            args, kwargs = [_to_float32(a) for a in args], {k: _to_float32(v) for k, v in kwargs.items()}
        return func(*args, **kwargs)


# ------------------------------------------------------------------------------------------ measuring


@dataclass(frozen=True)
class Shape:
    """What decides the bytes one forward pass keeps: the key of a measurement."""

    model: str  # a Hub id of benchmarks.architectures.HUB
    attention: str  # model.attention
    dtype: str  # fp32, fp16 or bf16 (autocast's)
    batch: int  # examples in the micro-batch
    length: int  # tokens per example
    num_labels: int  # the task's (1: a regression)
    dropout: Optional[float] = None  # model.dropout; null: the checkpoint's
    checkpointing: bool = False  # train.gradient_checkpointing
    lora: Optional[Tuple[int, int, float, Optional[Tuple[str, ...]]]] = None  # model.peft: r, alpha, dropout, targets
    cuda_kernels: bool = True  # count what CUDA's kernels keep (CudaKernels); false: the CPU's


@dataclass(frozen=True)
class Pass:
    """One depth's forward pass: its weights (counts) and what it keeps for the backward (bytes)."""

    parameters: int  # weights
    trainable: int  # weights that train
    largest: int  # weights in the largest tensor that trains (the word embeddings, in full fine-tuning)
    casts: int
    activations: int


@dataclass(frozen=True)
class Footprint:
    """A model at its full depth, extrapolated from two measured depths: weights (counts) and bytes."""

    parameters: int
    trainable: int
    largest: int
    casts: int
    activations: int
    per_layer: int  # activations of one layer (the mean over the layers' pattern)
    layers: int


def period(layer_types: Optional[Sequence[str]]) -> int:
    """Layers in one repeat of the layers' pattern: ModernBERT's (global, window, window) is 3; uniform 1."""
    if not layer_types:
        return 1
    types = list(layer_types)
    return next(p for p in range(1, len(types) + 1) if all(t == types[i % p] for i, t in enumerate(types)))


def build(shape: Shape, layers: int) -> torch.nn.Module:
    """The architecture at ``layers`` layers as nli.model.build and nli.recipe set it up (the task's labels,
    model.dropout, gradient checkpointing, then the adapters), on the meta device: no memory, no initialising."""
    from transformers import AutoModelForSequenceClassification

    from benchmarks.architectures import hub_config
    from nli.model.build import checkpointing

    changes: Dict[str, Any] = {"num_hidden_layers": layers, "num_labels": shape.num_labels,
                               "problem_type": "regression" if shape.num_labels == 1 else "single_label_classification"}
    if shape.dropout is not None:
        changes.update(hidden_dropout_prob=shape.dropout, attention_probs_dropout_prob=shape.dropout)
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(hub_config(shape.model, **changes),
                                                               attn_implementation=shape.attention)
    if shape.checkpointing:
        # The backward runs each layer again, outside the forward pass's CudaKernels: in them again.
        again = {"context_fn": lambda: (contextlib.nullcontext(), CudaKernels())} if shape.cuda_kernels else {}
        checkpointing(model)(use_reentrant=False, **again)
    if shape.lora is None:
        return model
    from nli.config.schema import LoraConfig
    from nli.model.lora import apply

    r, alpha, dropout, targets = shape.lora
    return apply(model, LoraConfig(r=r, alpha=alpha, dropout=dropout,
                                   target_modules=None if targets is None else list(targets)))


@functools.lru_cache(maxsize=None)
def _fake(architecture: Shape, layers: int) -> Tuple[torch.nn.Module, Any]:
    """The model on fake tensors, and their FakeTensorMode: built once for every batch, length and dtype."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    model, mode = build(architecture, layers), FakeTensorMode(allow_non_fake_inputs=True)
    with mode:
        model.to_empty(device="cpu")
    return model.train(), mode


@contextlib.contextmanager
def fake_model(shape: Shape, layers: int) -> Iterator[Tuple[torch.nn.Module, Dict[str, torch.Tensor]]]:
    """The model at ``layers`` layers in training mode, no gradients yet, and a batch for it (every example
    ``shape.length`` tokens long, one pad token so that the attention mask is there as in a padded batch), on
    fake tensors: shapes and dtypes, no data, no arithmetic."""
    model, mode = _fake(dataclasses.replace(shape, batch=1, length=8, dtype="fp32"), layers)
    model.zero_grad(set_to_none=True)
    mask = torch.ones(shape.batch, shape.length, dtype=torch.long)
    mask[-1, -1] = 0
    batch = {"input_ids": torch.zeros(shape.batch, shape.length, dtype=torch.long), "attention_mask": mask,
             "labels": torch.zeros(shape.batch, dtype=torch.float if shape.num_labels == 1 else torch.long)}
    with mode:
        yield model, batch


def computing(shape: Shape) -> contextlib.ExitStack:
    """The forward pass's setting: CUDA's kernels where asked, autocast in ``shape.dtype``."""
    stack = contextlib.ExitStack()
    if shape.cuda_kernels:
        stack.enter_context(CudaKernels())
    stack.enter_context(torch.autocast("cpu", dtype=DTYPES[shape.dtype], enabled=shape.dtype != "fp32"))
    return stack


def _count_checkpointed_inputs(model: torch.nn.Module, counter: SavedTensors) -> List[Any]:
    """Under gradient checkpointing each layer keeps the inputs it was called with (to run again in the
    backward) instead of its saved tensors: count them as each layer receives them. The hooks' handles."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    def keep(module: torch.nn.Module, args: Tuple[Any, ...], kwargs: Dict[str, Any]) -> None:
        for value in [*args, *kwargs.values()]:
            if isinstance(value, torch.Tensor):
                counter.add(value)

    return [module.register_forward_pre_hook(keep, with_kwargs=True) for module in model.modules()
            if isinstance(module, GradientCheckpointingLayer) and module.gradient_checkpointing]


def measure_pass(shape: Shape, layers: int, *, backward: bool = False) -> Pass:
    """One training forward pass of the architecture at ``layers`` layers, counting what autograd keeps for
    the backward; ``backward``: the backward too (the count is the same: by the end of the forward pass
    autograd has saved all it will keep)."""
    with fake_model(shape, layers) as (model, batch):
        counter = SavedTensors({storage_key(t) for t in [*model.parameters(), *model.buffers()]})
        hooks = _count_checkpointed_inputs(model, counter) if shape.checkpointing else []
        with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda tensor: tensor), computing(shape), \
                WeightCasts(counter):
            loss = model(**batch).loss
        if backward:
            loss.backward()
        for hook in hooks:
            hook.remove()
        trained = [p.numel() for p in model.parameters() if p.requires_grad]
        return Pass(parameters=sum(p.numel() for p in model.parameters()), trainable=sum(trained),
                    largest=max(trained), casts=counter.casts, activations=counter.activations)


@functools.lru_cache(maxsize=None)
def measure(shape: Shape) -> Footprint:
    """The full-depth model's weights and saved bytes, measured at two depths p layers apart (p: the period of
    its layers' pattern), 1 + p and 1 + 2p, the other layers extrapolated from the difference. Not from depth
    1: what the layers of a kind share (ModernBERT's rotary tables, one per kind of attention) is there once
    each kind is, and the first layer can differ (under LoRA, nothing before it needs a gradient)."""
    from benchmarks.architectures import hub_config

    full = hub_config(shape.model)
    layers, p = int(full.num_hidden_layers), period(getattr(full, "layer_types", None))
    if layers <= 1 + 2 * p:
        whole = measure_pass(shape, layers)
        return Footprint(parameters=whole.parameters, trainable=whole.trainable, largest=whole.largest,
                         casts=whole.casts, activations=whole.activations,
                         per_layer=round(whole.activations / layers), layers=layers)
    low, high = measure_pass(shape, 1 + p), measure_pass(shape, 1 + 2 * p)
    repeats = (layers - 1 - p) / p

    def extrapolate(field: str) -> int:
        first, then = getattr(low, field), getattr(high, field)
        return round(first + repeats * (then - first))

    return Footprint(parameters=extrapolate("parameters"), trainable=extrapolate("trainable"),
                     largest=max(low.largest, high.largest), casts=extrapolate("casts"),
                     activations=extrapolate("activations"), per_layer=round((high.activations - low.activations) / p),
                     layers=layers)


def backward_transient(shape: Shape, layers: int) -> Tuple[int, int]:
    """(what the second of two micro-batches holds at the end of its forward pass, the most its backward holds
    on top of that), in bytes: the backward of a step that accumulates, the gradients already there."""
    with fake_model(shape, layers) as (model, batch), \
            LiveTensors({storage_key(t) for t in [*model.parameters(), *model.buffers()]}) as live:
        for _ in range(2):
            start = live.live
            with computing(shape):
                loss = model(**batch).loss
            held = live.live - start
            live.reset_peak()
            loss.backward()
            del loss
        return held, live.peak - (start + held)


# ------------------------------------------------------------------------------------------- the rows


@dataclass(frozen=True)
class Row:
    """One preset x recipe: what one training process holds at its peak, in bytes."""

    hw: str
    recipe: str
    card: str
    card_memory: int
    processes: int  # the preset's data-parallel processes
    micro_batch: int
    length: int  # tokens per example
    dtype: str
    parameters: int
    gradients: int
    optimizer: int
    casts: int
    activations: int
    backward: int  # the backward's transient over the saved tensors
    slack: int  # the caching allocator's
    accumulate: int  # the largest trained weight's new gradient, before it is added to the accumulated one
    step: int  # the optimizer step's temporaries
    context: int

    @property
    def static(self) -> int:
        """What the process holds from the first step to the last."""
        return self.parameters + self.gradients + self.optimizer + self.context

    @property
    def total(self) -> int:
        """The static memory and the largest of three moments that do not coincide (the module's docstring)."""
        return self.static + max(self.casts + self.activations, self.accumulate, self.step) + self.backward + self.slack

    @property
    def margin(self) -> int:
        return self.card_memory - self.total

    @property
    def fits(self) -> bool:
        return self.margin >= 0


def precision_on(cfg: Any) -> str:
    """The dtype the run computes in on the preset's GPU: ``precision=auto`` takes bf16 where the GPU has it
    (compute capability 8.0 and up: A100, H100), else fp16 (V100, T4), as nli.runtime.device resolves it."""
    asked = str(cfg.precision.dtype.value)
    if asked != "auto":
        return asked
    return "bf16" if cfg.hw.bf16 else "fp16" if cfg.hw.fp16 else "fp32"


def optimizer_bytes(cfg: Any) -> Tuple[int, int]:
    """(state, step temporaries) in bytes per trained weight of ``cfg.optimizer``."""
    from nli.config.schema import AdamConfig, SGDConfig

    optimizer = cfg.optimizer
    if isinstance(optimizer, AdamConfig):  # exp_avg and exp_avg_sq; foreach's step makes sqrt(exp_avg_sq)
        return 8, 0 if optimizer.fused else 4
    if isinstance(optimizer, SGDConfig):  # the momentum buffer; Nesterov's step adds it to a copy of the gradient
        return (4 if optimizer.momentum else 0), (4 if optimizer.nesterov else 0)
    raise ValueError(f"no memory figures for optimizer {type(optimizer).__name__}")


def shape_of(cfg: Any, *, cuda_kernels: bool = True) -> Shape:
    """What the measurement needs of a composed config."""
    peft = cfg.model.peft
    lora = None if peft is None else (peft.r, peft.alpha, peft.dropout,
                                      None if peft.target_modules is None else tuple(peft.target_modules))
    return Shape(model=cfg.model.name_or_path, attention=cfg.model.attention.value, dtype=precision_on(cfg),
                 batch=cfg.micro_batch_size(cfg.hw.data_parallel_size), length=cfg.data.max_seq_length,
                 num_labels=cfg.task.num_labels, dropout=cfg.model.dropout,
                 checkpointing=cfg.train.gradient_checkpointing, lora=lora, cuda_kernels=cuda_kernels)


def estimate(cfg: Any, *, hw: str, recipe: str, cuda_kernels: bool = True) -> Row:
    """One training process's peak memory for the composed config ``cfg``."""
    shape = shape_of(cfg, cuda_kernels=cuda_kernels)
    model = measure(shape)
    card = CARDS[cfg.hw.gpu]
    processes = cfg.hw.data_parallel_size
    state, step = optimizer_bytes(cfg)
    backward = round(model.per_layer * (CHECKPOINTED_LAYERS if shape.checkpointing else BACKWARD_LAYERS))
    return Row(hw=hw, recipe=recipe, card=card.name, card_memory=card.memory, processes=processes,
               micro_batch=shape.batch, length=shape.length, dtype=shape.dtype, parameters=4 * model.parameters,
               gradients=4 * model.trainable, optimizer=state * model.trainable,
               casts=model.casts, activations=model.activations,
               backward=backward, slack=round(SLACK * (model.casts + model.activations + backward)),
               accumulate=4 * model.largest, step=step * model.trainable,
               context=CONTEXT + (NCCL if processes > 1 else 0))


def _yaml(path: Path) -> Dict[str, Any]:
    import yaml

    return dict(yaml.safe_load(path.read_text()) or {})


def gpu_presets() -> List[str]:
    """The hw presets that run on CUDA GPUs, the smallest cards and fewest processes first."""
    found = {path.stem: _yaml(path) for path in (ROOT / "conf" / "hw").glob("*.yaml")}
    gpus = [name for name, keys in found.items() if keys.get("accelerator") == "cuda"]

    def size(name: str) -> Tuple[int, int, str]:
        keys = found[name]
        return CARDS[keys["gpu"]].memory, keys.get("nodes", 1) * keys["gpus_per_node"], name

    return sorted(gpus, key=size)


def model_recipes() -> List[str]:
    """The recipes of conf/experiment that fine-tune a pretrained model (quickstart's tiny one is left out)."""
    names = []
    for path in sorted((ROOT / "conf" / "experiment").glob("*.yaml")):
        chosen = [item["override /model"] for item in _yaml(path).get("defaults", [])
                  if isinstance(item, dict) and "override /model" in item]
        if chosen and chosen[0] != "tiny":
            names.append(path.stem)
    return names


def preset(name: str) -> Any:
    """conf/hw/NAME.yaml on its schema, as Hydra builds the group (each preset's defaults list is the schema,
    then the file): an nli.config.schema.HardwareConfig."""
    from omegaconf import OmegaConf

    from nli.config.schema import HardwareConfig

    keys = {key: value for key, value in _yaml(ROOT / "conf" / "hw" / f"{name}.yaml").items() if key != "defaults"}
    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(HardwareConfig), keys))


def hw_overrides(recipe: str) -> Dict[str, Any]:
    """The ``hw`` keys the recipe's file sets (a per-device batch that fits its model, say): they win over the
    preset's, as the recipe comes after ``hw`` in conf/train.yaml's defaults list."""
    return dict(_yaml(ROOT / "conf" / "experiment" / f"{recipe}.yaml").get("hw") or {})


def with_preset(cfg: Any, hw: Any, overrides: Dict[str, Any]) -> Any:
    """``cfg`` (a recipe, composed once) on the preset ``hw`` with the recipe's own ``hw`` keys on top: the config
    ``experiment=RECIPE hw=PRESET`` composes (tests/benchmarks/test_memory.py compares them), its rules checked again
    (a ConfigError where the pair is refused). Hydra takes a third of a second to compose each pair."""
    from omegaconf import OmegaConf

    if overrides:
        hw = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(hw), overrides))
    return dataclasses.replace(cfg, hw=hw)


@dataclass(frozen=True)
class Refused:
    hw: str
    recipe: str
    reason: str  # the config's own message


def rows(presets: Sequence[str], recipes: Sequence[str], *,
         cuda_kernels: bool = True) -> Tuple[List[Row], List[Refused]]:
    """Every preset x recipe, preset by preset."""
    from nli.config.command import compose
    from nli.errors import UserError

    hardware = {hw: preset(hw) for hw in presets}
    done, refused = [], []
    for recipe in recipes:
        base, overrides = compose([f"experiment={recipe}"]), hw_overrides(recipe)
        for hw in presets:
            try:
                cfg = with_preset(base, hardware[hw], overrides)
            except UserError as err:
                refused.append(Refused(hw, recipe, str(err).splitlines()[0]))
                continue
            done.append(estimate(cfg, hw=hw, recipe=recipe, cuda_kernels=cuda_kernels))
    order = {hw: i for i, hw in enumerate(presets)}
    return sorted(done, key=lambda row: order[row.hw]), refused


# ------------------------------------------------------------------------------------------ the output


COLUMNS = ("hw", "recipe", "batch", "dtype", "params", "grads", "optim", "casts", "activ.", "trans.",
           "context", "total", "card", "fits")
LEGEND = (f"GiB per training process. batch: micro-batch x tokens per example. params: 4 B per weight; grads 4 B, "
          f"optim 8 B (AdamW) per trained weight; casts: autocast's half-precision "
          f"weights and activ.: the saved tensors, both measured; trans.: {BACKWARD_LAYERS:g} layer's saved bytes "
          f"({CHECKPOINTED_LAYERS:g} under gradient checkpointing) for the backward, + {SLACK:.0%} allocator slack; "
          f"context: CUDA {CONTEXT / GIB:.2f} (+ NCCL {NCCL / GIB:.2f}, several processes). total: the columns' sum, "
          "but where the embeddings' new gradient at the end of the backward (or the optimizer step's temporaries) "
          "outweighs casts + activ.: then that instead. fits: the card's memory minus the total.")


def _gib(value: int) -> str:
    return f"{value / GIB:.2f}"


def cells(row: Row) -> List[str]:
    """A row's cells, in GiB, in COLUMNS' order."""
    fits = f"{'yes' if row.fits else 'NO'} ({row.margin / GIB:+.2f})"
    return [row.hw, row.recipe, f"{row.micro_batch} x {row.length}", row.dtype, _gib(row.parameters),
            _gib(row.gradients), _gib(row.optimizer), _gib(row.casts), _gib(row.activations),
            _gib(row.backward + row.slack), _gib(row.context), _gib(row.total),
            f"{row.card} ({_gib(row.card_memory)})", fits]


def text_table(done: Sequence[Row]) -> str:
    table = [list(COLUMNS), *(cells(row) for row in done)]
    widths = [max(len(line[i]) for line in table) for i in range(len(COLUMNS))]
    numbers = range(2, len(COLUMNS) - 2)  # right-aligned
    text = ["  ".join(cell.rjust(width) if i in numbers else cell.ljust(width)
                      for i, (cell, width) in enumerate(zip(line, widths))).rstrip() for line in table]
    return "\n".join([text[0], "-" * len(text[0]), *text[1:]])


def markdown_table(done: Sequence[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "|" + "|".join("---:" if 4 <= i < len(COLUMNS) - 2 else "---" for i in range(len(COLUMNS))) + "|"]
    return "\n".join(lines + ["| " + " | ".join(cells(row)) + " |" for row in done])


def as_json(done: Sequence[Row], refused: Sequence[Refused]) -> Dict[str, Any]:
    return {"rows": [{**dataclasses.asdict(row), "total": row.total, "margin": row.margin, "fits": row.fits}
                     for row in done],
            "refused": [dataclasses.asdict(each) for each in refused],
            "allowances": {"context": CONTEXT, "nccl": NCCL, "slack": SLACK, "backward_layers": BACKWARD_LAYERS,
                           "checkpointed_layers": CHECKPOINTED_LAYERS}}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.memory", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hw", nargs="+", metavar="PRESET", help="these GPU presets (default: every one)")
    parser.add_argument("--experiment", nargs="+", metavar="RECIPE", help="these recipes (default: every one)")
    parser.add_argument("--markdown", action="store_true", help="a Markdown table (docs/distributed.md's)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write every row, in bytes, to PATH")
    parser.add_argument("--cpu-kernels", action="store_true",
                        help="count what the CPU's kernels keep, not CUDA's (to see what the substitution changes)")
    args = parser.parse_args(argv)
    presets, recipes = gpu_presets(), model_recipes()
    unknown = sorted(set(args.hw or []) - set(presets)) + sorted(set(args.experiment or []) - set(recipes))
    if unknown:
        parser.error(f"unknown {', '.join(unknown)}: GPU presets {', '.join(presets)}; recipes {', '.join(recipes)}")
    done, refused = rows(args.hw or presets, args.experiment or recipes, cuda_kernels=not args.cpu_kernels)
    print(markdown_table(done) if args.markdown else text_table(done))
    print(f"\n{LEGEND}")
    for each in refused:
        print(f"not composed: experiment={each.recipe} hw={each.hw}: {each.reason}")
    if args.json:
        args.json.write_text(json.dumps(as_json(done, refused), indent=2) + "\n")
        print(f"written to {args.json}")
    return 0 if all(row.fits for row in done) else 1


if __name__ == "__main__":
    sys.exit(main())
