"""``python -m benchmarks.memory``: what it counts is what autograd keeps, its extrapolations hold, its allowances
cover what it does not count, and every GPU preset fits every recipe (a preset or recipe changed so that one
does not fit fails here)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
from pathlib import Path
from typing import Callable, Dict, List, Tuple

import pytest
import torch
import torch.nn.functional as F
from transformers import AutoModelForSequenceClassification

from benchmarks import memory
from benchmarks.architectures import HUB, hub_config
from benchmarks.memory import (
    CONTEXT,
    GIB,
    CudaKernels,
    LiveTensors,
    SavedTensors,
    Shape,
    WeightCasts,
    backward_transient,
    measure,
    measure_pass,
    storage_key,
)
from nli.config.command import compose
from tests.support.runs import ROOT

ROBERTA = Shape("FacebookAI/roberta-base", "sdpa", "bf16", batch=2, length=32, num_labels=3)


def saved(run: Callable[[], object], weights: Tuple[torch.Tensor, ...] = ()) -> SavedTensors:
    """What autograd saves while ``run()`` runs, counted."""
    counter = SavedTensors({storage_key(w) for w in weights})
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda tensor: tensor), WeightCasts(counter):
        run()
    return counter


# ------------------------------------------------------------------------------------------- counting


def test_a_storage_saved_through_several_views_counts_once() -> None:
    x = torch.randn(16, 32, requires_grad=True)  # 2,048 bytes
    weight = torch.nn.Parameter(torch.randn(32, 8))
    calls = []

    def run() -> None:
        calls.append(torch.sin(x))  # saves x
        calls.append(torch.sin(x.t()))  # saves x.t(): x's storage again
        calls.append(calls[0] @ weight)  # saves sin(x) (a new storage) and the weight (a parameter: left out)

    counter = saved(run, weights=(weight,))
    assert sorted(counter.bytes.values()) == [2048, 2048]
    assert counter.activations == 4096 and counter.casts == 0


def test_autocast_copies_of_weights_are_counted_apart() -> None:
    x = torch.randn(16, 32, requires_grad=True)
    weight = torch.nn.Parameter(torch.randn(8, 32))

    def run() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            F.linear(x, weight)  # saves x and the weight, each cast to bf16

    counter = saved(run, weights=(weight,))
    assert counter.casts == 8 * 32 * 2 and counter.activations == 16 * 32 * 2


def test_cuda_kernels_keep_what_cuda_keeps() -> None:
    """Dropout keeps a 1-byte mask, not one of the input's dtype; attention keeps queries, keys, values, output and
    a float32 logsumexp, not its probabilities; softmax runs in float32 under autocast."""
    x = torch.randn(64, 32, requires_grad=True)
    for kernels, mask_bytes in ((CudaKernels(), 1), (None, 4)):
        with kernels or contextlib.nullcontext():
            counter = saved(lambda: F.dropout(x, 0.1, training=True))
        assert counter.activations == 64 * 32 * mask_bytes

    q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))  # batch, heads, length, width
    with CudaKernels():
        fused = saved(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1))
    per_tensor = 2 * 4 * 64 * 16 * 4
    assert fused.activations == 4 * per_tensor + 2 * 4 * 64 * 4  # q, k, v, output; a logsumexp per query
    cpu = saved(lambda: F.scaled_dot_product_attention(q, k, v, dropout_p=0.1))
    assert cpu.activations >= 2 * 4 * 64 * 64 * 4  # the CPU keeps the probabilities

    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert F.softmax(x.bfloat16(), dim=-1).dtype == torch.bfloat16
        with CudaKernels():
            assert F.softmax(x.bfloat16(), dim=-1).dtype == torch.float32
            assert F.layer_norm(x.bfloat16(), (32,)).dtype == torch.float32


def test_the_live_count_follows_allocations_and_frees() -> None:
    with LiveTensors() as live:
        a = torch.empty(1024)
        b = torch.empty(256)
        assert live.live == 1024 * 4 + 256 * 4
        del a
        assert live.live == 256 * 4 and live.peak == 1280 * 4
        live.reset_peak()
        assert live.peak == 1024
        del b


# ------------------------------------------------------------------------------------------ measuring


def test_activations_grow_linearly_with_layers_and_batch() -> None:
    by_depth = [measure_pass(ROBERTA, layers).activations for layers in (1, 2, 3)]
    assert by_depth[2] - by_depth[1] == by_depth[1] - by_depth[0] > 0
    by_batch = [measure_pass(dataclasses.replace(ROBERTA, batch=batch), 2) for batch in (2, 4, 6)]
    assert by_batch[2].activations - by_batch[1].activations == by_batch[1].activations - by_batch[0].activations
    assert 0 <= 2 * by_batch[0].activations - by_batch[1].activations < 64  # all but the loss's scalars per example
    assert by_batch[0].casts == by_batch[2].casts  # the weights' copies do not grow with the batch


def test_activations_grow_about_linearly_with_length() -> None:
    short, long = (measure_pass(dataclasses.replace(ROBERTA, length=length), 2).activations for length in (64, 128))
    assert 2 <= long / short < 2.1  # with fused attention only the mask's bias grows with length squared
    cpu = measure_pass(dataclasses.replace(ROBERTA, length=128, cuda_kernels=False), 2).activations
    assert cpu - long >= 2 * 2 * 12 * 128 * 128 * 4  # probabilities, two layers: what CUDA's kernels never keep


def test_deberta_keeps_its_relative_positions_once_per_batch() -> None:
    deberta = Shape("microsoft/deberta-v3-xsmall", "eager", "fp16", batch=1, length=64, num_labels=3)
    counts = [measure_pass(dataclasses.replace(deberta, batch=batch), 2).activations for batch in (1, 2, 3)]
    assert counts[2] - counts[1] == counts[1] - counts[0] < counts[0]  # linear, plus what no example owns


@pytest.mark.parametrize("model", ["microsoft/deberta-v3-small", "answerdotai/ModernBERT-base"])
def test_extrapolating_from_two_depths_is_measuring_the_full_depth(model: str) -> None:
    """ModernBERT's layers repeat in threes (one global, two windowed): two depths three layers apart."""
    shape = Shape(model, "eager" if "deberta" in model else "sdpa", "bf16", batch=2, length=256, num_labels=3)
    full = measure_pass(shape, int(hub_config(model).num_hidden_layers))
    extrapolated = measure(shape)
    assert (extrapolated.activations, extrapolated.casts, extrapolated.parameters) == \
        (full.activations, full.casts, full.parameters)


def test_checkpointing_keeps_each_layers_inputs_instead_of_its_activations() -> None:
    plain = measure(ROBERTA)
    checkpointed = measure(dataclasses.replace(ROBERTA, checkpointing=True))
    hidden = ROBERTA.batch * ROBERTA.length * 768 * 4  # a layer's input: the fp32 residual stream
    assert checkpointed.activations < plain.activations / 4
    assert checkpointed.activations >= 12 * hidden


def test_lora_trains_the_adapters_and_the_head_alone() -> None:
    lora = measure(dataclasses.replace(ROBERTA, lora=(8, 16, 0.0, None)))
    full = measure(ROBERTA)
    adapters = 12 * 2 * 8 * (768 + 768)  # query and value of 12 layers: A (8 x 768) and B (768 x 8)
    head = 768 * 768 + 768 + 768 * 3 + 3  # dense and out_proj, a trainable copy beside the frozen one
    assert lora.trainable == adapters + head
    assert lora.parameters == full.parameters + adapters + head


@pytest.mark.parametrize("model,batch,checkpointing", [
    ("FacebookAI/roberta-base", 32, False), ("FacebookAI/roberta-base", 32, True),
    ("FacebookAI/roberta-base", 1, False),  # the embeddings' gradient outweighs the activations
    ("microsoft/deberta-v3-xsmall", 32, True), ("answerdotai/ModernBERT-base", 16, False)])
def test_the_backward_holds_no_more_than_the_table_allows(model: str, batch: int, checkpointing: bool) -> None:
    """Every tensor alive counted (LiveTensors), in the backward of a step that accumulates (its gradients already
    there): at its peak it holds no more than the table's formula allows on top of them: the saved tensors (or,
    at its end, the embeddings' new gradient) and the allowance for the backward."""
    shape = Shape(model, "eager" if "deberta" in model else "sdpa", "fp16", batch=batch, length=256, num_labels=3,
                  checkpointing=checkpointing)
    layers = 1 + 2 * memory.period(getattr(hub_config(model), "layer_types", None))
    kept = measure_pass(shape, layers)
    per_layer = (measure_pass(dataclasses.replace(shape, checkpointing=False), layers).activations -
                 measure_pass(dataclasses.replace(shape, checkpointing=False), layers - 1).activations)
    allowed = (memory.CHECKPOINTED_LAYERS if checkpointing else memory.BACKWARD_LAYERS) * per_layer
    held, transient = backward_transient(shape, layers)
    assert held == pytest.approx(kept.casts + kept.activations, rel=0.01)  # the saved tensors, and the outputs
    assert held + transient <= max(kept.casts + kept.activations, 4 * kept.largest) + allowed


# ------------------------------------------------------------------------------------------ architectures


def _stated_parameters(text: str) -> int:
    """The parameter count a conf/model file's comment states: "(355M parameters)" or "(86M backbone + 98M
    embedding)"."""
    millions = [int(n) for n in re.findall(r"(\d+)M (?:parameters|backbone|embedding)", text.split("\n", 1)[0])]
    return sum(millions) * 10**6


@pytest.mark.parametrize("path", sorted((ROOT / "conf" / "model").glob("*.yaml")), ids=lambda path: path.stem)
def test_every_checkpoint_of_conf_model_has_its_shapes(path: Path) -> None:
    name = re.search(r"^name_or_path: (\S+)$", path.read_text(), re.M)
    if name is None or name.group(1) == "null":
        pytest.skip("a model from scratch: its shapes are in the file")
    assert name.group(1) in HUB, f"{path.name}: add {name.group(1)} to benchmarks/architectures.py"
    stated = _stated_parameters(path.read_text())
    if stated:
        with torch.device("meta"):
            model = AutoModelForSequenceClassification.from_config(hub_config(name.group(1), num_labels=3))
        assert sum(p.numel() for p in model.parameters()) == pytest.approx(stated, rel=0.03)


# ----------------------------------------------------------------------------------------------- rows


def test_a_row_adds_up() -> None:
    """roberta-large on one V100: 16 bytes per weight, what the pass keeps, the allowances."""
    cfg = compose(["experiment=roberta-large-mnli", "hw=v100"])
    row = memory.estimate(cfg, hw="v100", recipe="roberta-large-mnli")
    with torch.device("meta"):
        weights = sum(p.numel() for p in AutoModelForSequenceClassification.from_config(
            hub_config("FacebookAI/roberta-large", num_labels=3)).parameters())
    assert (row.micro_batch, row.length, row.dtype, row.processes) == (16, 128, "fp16", 1)
    assert (row.parameters, row.gradients, row.optimizer) == (4 * weights, 4 * weights, 8 * weights)
    footprint = measure(memory.shape_of(cfg))
    assert (row.activations, row.casts) == (footprint.activations, footprint.casts)
    assert row.backward == footprint.per_layer
    assert row.slack == round(0.1 * (row.casts + row.activations + row.backward))
    assert row.total == 16 * weights + row.casts + row.activations + row.backward + row.slack + CONTEXT
    assert row.card_memory == 16160 * 2**20 and row.fits


def test_several_processes_add_nccl_and_no_second_copy_of_the_gradients() -> None:
    """DDP's buckets are the gradients (gradient_as_bucket_view): NCCL's buffers are what several processes add."""
    cfg = compose(["experiment=roberta-large-mnli", "hw=8xa100"])
    row = memory.estimate(cfg, hw="8xa100", recipe="roberta-large-mnli")
    assert row.micro_batch == 4  # the process's share of the batch of 32 caps the preset's 32
    single = memory.estimate(cfg, hw="a100", recipe="roberta-large-mnli")
    assert row.dtype == "bf16" and row.gradients == single.gradients and row.context == CONTEXT + memory.NCCL


@pytest.mark.parametrize("hw", memory.gpu_presets())
def test_a_recipe_on_a_preset_is_what_hydra_composes(hw: str) -> None:
    """The table puts each recipe, composed once, on each preset: the config Hydra composes for the pair,
    the recipe's own hw keys included (deberta-v3-large-mnli's per-device batch)."""
    recipe = "deberta-v3-large-mnli"
    assert memory.hw_overrides(recipe)
    placed = memory.with_preset(compose([f"experiment={recipe}"]), memory.preset(hw), memory.hw_overrides(recipe))
    assert placed == compose([f"experiment={recipe}", f"hw={hw}"])


def test_a_bigger_card_fits_the_bigger_batch_the_docs_show() -> None:
    """docs/distributed.md and deberta-v3-large-mnli's comment: hw=a100 fits 32 per GPU, where the recipe asks 8."""
    cfg = compose(["experiment=deberta-v3-large-mnli", "hw=a100", "hw.per_device_batch_size=32"])
    row = memory.estimate(cfg, hw="a100", recipe="deberta-v3-large-mnli")
    assert row.micro_batch == 32 and row.fits
    assert compose(["experiment=deberta-v3-large-mnli", "hw=a100"]).hw.per_device_batch_size == 8


def test_the_command_writes_its_table_and_json(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "memory.json"
    assert memory.main(["--hw", "t4", "--experiment", "electra-base-mnli", "--markdown", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert printed.startswith("| hw | recipe | batch | dtype | params |")
    (row,) = json.loads(out.read_text())["rows"]
    assert (row["hw"], row["recipe"], row["micro_batch"], row["dtype"], row["fits"]) == ("t4", "electra-base-mnli",
                                                                                         16, "fp16", True)
    assert f"| t4 | electra-base-mnli | 16 x 128 | fp16 | {row['parameters'] / GIB:.2f} |" in printed


def test_the_command_names_what_it_does_not_know(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit):
        memory.main(["--hw", "cpu"])
    assert "unknown cpu: GPU presets t4, v100" in capsys.readouterr().err


def _all_rows() -> Tuple[List[memory.Row], List[memory.Refused]]:
    return memory.rows(memory.gpu_presets(), memory.model_recipes())


@pytest.mark.bench
def test_every_gpu_preset_fits_every_recipe() -> None:
    """Each GPU preset with each recipe fits its card (a preset or recipe whose per-device batch does not fit
    fails here: set hw.per_device_batch_size in the recipe, docs/distributed.md#will-it-fit). The pairs the
    config refuses are those whose global batch is smaller than the preset's GPUs."""
    done, refused = _all_rows()
    assert len(done) + len(refused) == len(memory.gpu_presets()) * len(memory.model_recipes())
    too_big = {f"{row.hw} x {row.recipe}: {row.total / GIB:.2f} of {row.card_memory / GIB:.2f} GiB"
               for row in done if not row.fits}
    assert not too_big
    assert all("train.batch_size" in each.reason for each in refused)


@pytest.mark.bench
def test_the_docs_table_is_the_commands() -> None:
    done, _ = _all_rows()
    page = (ROOT / "docs" / "distributed.md").read_text()
    assert memory.markdown_table(done) in page, "docs/distributed.md: paste `python -m benchmarks.memory --markdown`"


def test_every_recipe_and_gpu_preset_is_in_the_table() -> None:
    recipes: Dict[str, bool] = {path.stem: "override /model: tiny" not in path.read_text()
                                for path in (ROOT / "conf" / "experiment").glob("*.yaml")}
    assert memory.model_recipes() == sorted(name for name, pretrained in recipes.items() if pretrained)
    presets = [path.stem for path in (ROOT / "conf" / "hw").glob("*.yaml") if "accelerator: cuda" in path.read_text()]
    assert sorted(memory.gpu_presets()) == sorted(presets)
    assert all(memory.preset(hw).gpu in memory.CARDS for hw in presets)
