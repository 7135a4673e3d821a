"""Faster forwards for BERT- and RoBERTa-family sequence classifiers; :func:`install` decides which.

Four paths, each replacing transformers' code on one model instance (weights and their names stay
as they are, so checkpoints and exports are unchanged):

- ``first_token`` (:mod:`.first_token`): the head reads only the first token of the last layer, so
  that layer computes its queries, attention output and feed-forward block for that token alone.
  Any device.
- ``cpu_dropout`` (:mod:`.cpu_dropout`): dropout masks from 16 random bits per element, and SDPA
  attention with that dropout written out. CPU only, not with ``torch.compile``.
- ``unpadded`` (:mod:`.unpadded`): every layer but the last on the batch's real tokens alone,
  padding skipped. CPU only, not with ``torch.compile``.
- ``embed_grad`` (:mod:`.embed_grad`): the word embeddings' gradient in one buffer kept
  for the run, not a fresh dense tensor every step. CPU only, not with ``torch.compile``, not in
  a distributed run (DDP waits for the weight's gradient hook, which it bypasses).

The same logits and gradients as the stock model to float rounding, ``embed_grad``'s to the bit (what
each saves: ``benchmarks/RESULTS.md``). ``model.fast_paths=false`` (``enabled=False``) turns all four off:
transformers' own forward.

They were written against one transformers version (:data:`TRANSFORMERS`) and its BERT-style
encoders: with another version, another architecture, or attention other than ``sdpa``/``eager``,
:func:`install` logs why and leaves the stock forward. Hidden states and attentions come from
transformers' forward alone: a model whose config asks for them gets no fast path, and a forward
called with ``output_hidden_states`` or ``output_attentions`` runs the stock forward for that call.

Nothing happens on import; call :func:`install` once per model, after it is on its device.
"""

from __future__ import annotations

import contextlib
import logging
import types
from typing import Any, Collection, Iterator, List, Optional, Tuple

import torch
import transformers
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from torch import nn
from transformers import PreTrainedModel

from nli.model.fastpaths import cpu_dropout, embed_grad, first_token, unpadded

__all__ = ["install", "PATHS"]

log = logging.getLogger(__name__)

PATHS = ("first_token", "cpu_dropout", "unpadded", "embed_grad")  # in the order they are installed
CPU_ONLY = frozenset({"cpu_dropout", "unpadded", "embed_grad"})
TRANSFORMERS = SpecifierSet("==5.23.*")  # the transformers the paths were written against (pinned: 5.23.0)
_INSTALLED = "_nli_fast_paths"  # the model's attribute naming what install() did
_PATCHES = "_nli_fast_path_patches"  # the model's and its base model's: (the model, what install() changed)


def install(model: PreTrainedModel, *, device: torch.device, enabled: bool = True, compiled: bool = False,
            distributed: bool = False, trains: bool = True, only: Optional[Collection[str]] = None) -> List[str]:
    """Install on ``model`` (already on ``device``) the fast paths that apply; the names of those
    installed, in :data:`PATHS` order.

    ``first_token`` on any device; the others where ``device`` is a CPU and the model is not to be
    ``compiled`` (a compiled model fuses its own dropout and wants fixed shapes); ``embed_grad``
    only for a model that ``trains``, and not where it trains ``distributed``.
    ``enabled=False``: none. ``only``: at most these (names from :data:`PATHS`). Call once per model.
    """
    wanted = list(PATHS) if only is None else [name for name in PATHS if name in set(only)]
    unknown = set(only or ()) - set(PATHS)
    if unknown:
        raise ValueError(f"unknown fast path(s) {sorted(unknown)}: choose from {list(PATHS)}")
    if getattr(model, _INSTALLED, None) is not None:
        raise RuntimeError(f"fast paths already installed on this model ({getattr(model, _INSTALLED)}): "
                           "install() is called once")
    device = torch.device(device)
    if not enabled:
        log.debug("fast paths: off (model.fast_paths=false)")
        return []
    if device.type != "cpu" or compiled:
        wanted = [name for name in wanted if name not in CPU_ONLY]
    if distributed or not trains:
        wanted = [name for name in wanted if name != "embed_grad"]
    if not wanted:
        return []
    reasons, version_ok = _unsupported(model)
    if reasons:  # one line; a transformers upgrade is worth a warning, the rest is a model's nature
        log.log(logging.INFO if version_ok else logging.WARNING,
                "fast paths: none installed, the stock forward runs: %s", "; ".join(reasons))
        return []

    patches = _Patches()
    if "first_token" in wanted:
        first_token.install(model)  # the head reads one token: the last layer computes that one alone
        patches.methods.append(model.base_model.encoder.layer[-1])
    if "cpu_dropout" in wanted:
        attention = model.config._attn_implementation
        patches.modules = cpu_dropout.install(model)
        if model.config._attn_implementation != attention:
            patches.attention = attention
    if "unpadded" in wanted:
        unpadded.install(model)
        patches.methods.append(model.base_model.encoder)
    if "embed_grad" in wanted:
        embeddings = model.get_input_embeddings()
        if embed_grad.install(embeddings):
            patches.methods.append(embeddings)
        else:  # e.g. frozen under LoRA
            wanted.remove("embed_grad")
    for module in (model, model.base_model):  # the classifier, and its encoder called alone
        module.forward = types.MethodType(_stock_when_outputs_requested, module)
        object.__setattr__(module, _PATCHES, (model, patches))
    object.__setattr__(model, _INSTALLED, wanted)
    log.info("fast paths: %s", ", ".join(wanted))
    return wanted


def _unsupported(model: PreTrainedModel) -> Tuple[List[str], bool]:
    """Why the paths do not apply to ``model`` here (none where they do), and whether the installed
    transformers is the one they were written against."""
    reasons = []
    version = transformers.__version__
    try:
        version_ok = TRANSFORMERS.contains(Version(version), prereleases=True)
    except InvalidVersion:
        version_ok = False
    if not version_ok:
        reasons.append(f"transformers {version}, not the {TRANSFORMERS} they were written against")
    if not first_token.applies(model):
        reasons.append(f"architecture {type(model).__name__} with {model.config._attn_implementation} attention, "
                       f"not one of {sorted(first_token.HEADS)} with sdpa or eager attention")
    config = model.config
    asked = [name for name in ("output_hidden_states", "output_attentions") if getattr(config, name, False)]
    if asked:
        reasons.append(f"the model's config sets {' and '.join(asked)}, which the stock forward alone returns")
    return reasons, version_ok


class _Patches:
    """What install() changed, so that a call asking for hidden states or attentions can undo it."""

    def __init__(self) -> None:
        self.methods: List[nn.Module] = []  # modules given their own forward
        self.modules: List[Tuple[nn.Module, str, nn.Dropout]] = []  # (parent, name, the stock module) replaced
        self.attention: Optional[str] = None  # the stock attention implementation, where it was replaced
        self.undone = False  # inside a call that runs the stock forward


def _requested(module: nn.Module, kwargs: dict, name: str) -> bool:
    """Whether this call asks for ``name`` (hidden states or attentions), as transformers decides:
    the argument if given, else the config. An index (some hidden states) counts as asking."""
    value = kwargs.get(name, getattr(module.config, name, False))
    return value is not None and value is not False


def _stock_when_outputs_requested(module: nn.Module, *args: Any, **kwargs: Any) -> Any:
    """The classifier's or its base model's own forward; for a call that asks for hidden states or
    attentions, which transformers collects from its stock modules, as transformers built the model."""
    forward = type(module).forward
    model, patches = getattr(module, _PATCHES)
    if patches.undone or not (_requested(module, kwargs, "output_hidden_states")
                              or _requested(module, kwargs, "output_attentions")):
        return forward(module, *args, **kwargs)
    with _stock(model, patches):
        return forward(module, *args, **kwargs)


@contextlib.contextmanager
def _stock(model: PreTrainedModel, patches: _Patches) -> Iterator[None]:
    """``model`` as transformers built it, for the duration; then as it was."""
    methods, modules, attention = [], [], model.config._attn_implementation
    patches.undone = True
    try:
        for module in patches.methods:
            methods.append((module, vars(module).pop("forward")))
        for parent, name, stock in patches.modules:
            modules.append((parent, name, getattr(parent, name)))
            setattr(parent, name, stock.train(modules[-1][2].training))
        if patches.attention is not None:
            model.set_attn_implementation(patches.attention)
        yield
    finally:
        if model.config._attn_implementation != attention:
            model.set_attn_implementation(attention)
        for parent, name, module in modules:
            setattr(parent, name, module)
        for module, forward in methods:
            module.forward = forward
        patches.undone = False
