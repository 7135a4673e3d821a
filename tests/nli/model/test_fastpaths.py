"""The fast paths (nli/model/fastpaths/): installed as the config says, for the architectures and
transformers they were written for, computing what the stock forward computes."""

from __future__ import annotations

import copy
import importlib.util
import json
import logging
import math
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import pytest
import torch
from torch import nn
from transformers import AutoConfig, AutoModelForSequenceClassification, AutoModelForTokenClassification

from nli.config.schema import (
    Attention,
    ConfigError,
    ModelConfig,
    ScratchArchitecture,
    TaskConfig,
)
from nli.model import fastpaths
from nli.model.build import build_model, train_bpe_tokenizer
from nli.model.fastpaths import cpu_dropout, embed_grad, first_token, unpadded


def test_attention_implementation_and_fast_paths_come_from_config() -> None:
    tokenizer = train_bpe_tokenizer(["a small text", "another one"] * 50, vocab_size=300, max_seq_length=32)
    task = TaskConfig(name="t", text_fields=["a", "b"], label_names=["x", "y"], eval_splits={"validation": ""},
                      metrics=["accuracy"], main_metric="accuracy")
    cpu = torch.device("cpu")
    for attention in (Attention.sdpa, Attention.eager):
        model_cfg = ModelConfig(name_or_path=None, scratch=ScratchArchitecture(vocab_size=300), attention=attention)
        model = build_model(model_cfg, task, tokenizer)
        assert model.config._attn_implementation == attention.value
        assert not any("forward" in vars(module) for module in model.modules())  # as transformers builds it
        # As the run installs them, once the model is on its device.
        assert fastpaths.install(model, device=cpu, enabled=model_cfg.fast_paths) == list(fastpaths.PATHS)
        assert "forward" in vars(model.base_model.encoder.layer[-1])  # the last layer: the first token alone
        assert any(isinstance(m, cpu_dropout.CpuDropout) for m in model.modules())
        assert "forward" in vars(model.base_model.encoder)  # real tokens only
    off = ModelConfig(name_or_path=None, scratch=ScratchArchitecture(vocab_size=300), fast_paths=False)
    stock = build_model(off, task, tokenizer)
    assert fastpaths.install(stock, device=cpu, enabled=off.fast_paths) == []
    assert not any("forward" in vars(module) for module in stock.modules())  # as transformers builds it
    assert not any(isinstance(m, cpu_dropout.CpuDropout) for m in stock.modules())
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(ConfigError, match="needs the flash-attn package"):
            build_model(ModelConfig(name_or_path=None, scratch=ScratchArchitecture(vocab_size=300),
                                    attention=Attention.flash_attention_2), task, tokenizer)


def test_cpu_dropout_drops_p_of_the_elements_and_scales_the_rest() -> None:
    torch.manual_seed(0)
    for p in (0.1, 0.5):
        dropped = cpu_dropout.drop(torch.ones(1000, 1001), p)  # an odd count: half a random word is left over
        assert (dropped == 0).float().mean().item() == pytest.approx(p, abs=0.002)
        assert dropped.unique().tolist() == [0.0, pytest.approx(1 / (1 - p))]
    torch.manual_seed(0)
    first = cpu_dropout.keep_mask(torch.Size([64, 64]), 0.1)
    torch.manual_seed(0)
    assert torch.equal(first, cpu_dropout.keep_mask(torch.Size([64, 64]), 0.1))  # torch's generator decides


def test_cpu_dropout_attention_masks_padding_and_drops_the_probabilities() -> None:
    torch.manual_seed(0)
    query, key, value = (torch.randn(2, 3, 5, 4) for _ in range(3))
    allowed = torch.ones(2, 1, 5, 5, dtype=torch.bool)
    allowed[1, :, :, 3:] = False  # the second sequence has two pad tokens
    module = torch.nn.Module()
    torch.manual_seed(7)
    out, _ = cpu_dropout.attention(module, query, key, value, allowed, dropout=0.2, scaling=0.5)
    torch.manual_seed(7)
    keep = cpu_dropout.keep_mask(torch.Size([2, 3, 5, 5]), 0.2)
    probs = torch.softmax((query @ key.transpose(2, 3) * 0.5).masked_fill(~allowed, float("-inf")), dim=-1)
    expected = ((probs * keep / 0.8) @ value).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-6)


def _tiny_classifier(model_type: str, attention: str = "sdpa", dropout: float = 1e-9,
                     **config_kwargs: object) -> AutoModelForSequenceClassification:
    """A 2-layer model; by default its dropout probability is too small to drop anything."""
    config = AutoConfig.for_model(model_type, vocab_size=100, hidden_size=32, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=64, num_labels=3, pad_token_id=1,
                                  hidden_dropout_prob=dropout, attention_probs_dropout_prob=dropout, **config_kwargs)
    torch.manual_seed(0)
    return AutoModelForSequenceClassification.from_config(config, attn_implementation=attention).eval()


def _batches() -> List[Dict[str, torch.Tensor]]:
    """A padded batch, and one without padding (SDPA is then given no mask)."""
    torch.manual_seed(1)
    mask = torch.ones(4, 12, dtype=torch.long)
    mask[1, 7:], mask[3, 3:] = 0, 0
    padded = {"input_ids": torch.randint(3, 100, (4, 12)).masked_fill(mask == 0, 1), "attention_mask": mask}
    return [padded, {"input_ids": torch.randint(3, 100, (2, 9)), "attention_mask": torch.ones(2, 9, dtype=torch.long)}]


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_a_model_with_cpu_dropout_computes_what_it_did(model_type: str) -> None:
    """In evaluation the same logits; in training with a drop probability too small to drop
    anything, the same logits through the new attention and dropout."""
    model = _tiny_classifier(model_type)
    before = [model(**batch).logits for batch in _batches()]
    cpu_dropout.install(model)
    assert model.config._attn_implementation == cpu_dropout.ATTENTION
    assert sum(isinstance(m, cpu_dropout.CpuDropout) for m in model.modules()) == 8  # embeddings, 3 per layer, head
    for batch, logits in zip(_batches(), before):
        assert torch.equal(model.eval()(**batch).logits, logits)
        assert torch.allclose(model.train()(**batch).logits, logits, atol=1e-6)


@pytest.mark.parametrize("model_type,attention", [("bert", "sdpa"), ("roberta", "sdpa"), ("roberta", "eager")])
def test_the_last_layer_for_the_first_token_alone_gives_the_same_logits(model_type: str, attention: str) -> None:
    model = _tiny_classifier(model_type, attention)
    names = list(model.state_dict())
    before = [model(**batch).logits for batch in _batches()]
    model.train()
    trained = [model(**batch).logits for batch in _batches()]
    assert first_token.install(model)
    assert list(model.state_dict()) == names  # checkpoints and exports unchanged
    for batch, logits, train_logits in zip(_batches(), before, trained):
        assert torch.allclose(model.eval()(**batch).logits, logits, atol=1e-6)
        assert torch.allclose(model.train()(**batch).logits, train_logits, atol=1e-6)
    cpu_dropout.install(model)  # as train.py runs on the CPU: both together
    for batch, logits in zip(_batches(), trained):
        assert torch.allclose(model(**batch).logits, logits, atol=1e-6)
    hidden = model.base_model(**_batches()[0]).last_hidden_state
    assert hidden.shape[1] == 1  # only the first position was computed


def _outputs(model: torch.nn.Module, batch: Dict[str, torch.Tensor]) -> List[torch.Tensor]:
    """The logits and every weight's gradient of their sum."""
    model.zero_grad()
    logits = model(**batch).logits
    logits.sum().backward()
    return [logits.detach()] + [p.grad.clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("model_type,attention", [("bert", "sdpa"), ("roberta", "sdpa"), ("roberta", "eager")])
def test_layers_on_real_tokens_only_give_the_same_logits_and_gradients(model_type: str, attention: str) -> None:
    model = _tiny_classifier(model_type, attention).train()  # dropout too small to drop anything
    left = {"input_ids": torch.tensor([[1, 1, 5, 6], [7, 8, 9, 10]]), "attention_mask": torch.tensor([[0, 0, 1, 1],
                                                                                                      [1, 1, 1, 1]])}
    batches = [*_batches(), left]
    expected = [_outputs(model, batch) for batch in batches]
    first_token.install(model)
    cpu_dropout.install(model)  # all three, as train.py runs on the CPU
    assert unpadded.install(model)
    assert len(expected[0]) == 1 + len(list(model.parameters()))  # every weight has a gradient
    rows: List[torch.Size] = []  # what the first layer's feed-forward is given
    model.base_model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, x, y: rows.append(x[0].shape))
    for batch, outputs in zip(batches, expected):
        for got, want in zip(_outputs(model, batch), outputs, strict=True):
            assert torch.allclose(got, want, atol=1e-5)
        assert torch.allclose(model.eval()(**batch).logits, outputs[0], atol=1e-5)
        model.train()
    real = int(batches[0]["attention_mask"].sum())
    assert rows[0] == (real, 32) and real < 4 * 12  # the padded batch: its real tokens alone
    assert rows[2] == (2, 9, 32) and rows[4] == (2, 4, 32)  # no padding, or padding on the left: the stock layers


def test_in_bf16_the_layers_compute_a_multiple_of_64_rows_and_the_same_logits_and_gradients() -> None:
    """oneDNN builds a kernel for every new shape of a bf16 matrix product (milliseconds each): under bf16
    autocast the real tokens are topped up with padding places to a multiple of unpadded.ROWS (at most the
    whole padded batch), so that a few shapes recur; the padding rows change no logit and no gradient."""
    model = _tiny_classifier("roberta").train()
    torch.manual_seed(2)
    mask = (torch.arange(40) < torch.randint(3, 40, (8, 1))).long()  # 8 sequences of 3 to 39 tokens
    batch = {"input_ids": torch.randint(3, 100, (8, 40)).masked_fill(mask == 0, 1), "attention_mask": mask}
    small = _batches()[0]  # 4 x 12 places, fewer than 64 rows in all
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = [_outputs(model, each) for each in (batch, small)]
    first_token.install(model)
    assert unpadded.install(model)
    rows: List[torch.Size] = []
    model.base_model.encoder.layer[0].intermediate.dense.register_forward_hook(lambda m, x, y: rows.append(x[0].shape))
    for each, outputs in zip((batch, small), expected):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            got = _outputs(model, each)
        for ours, stock in zip(got, outputs, strict=True):
            assert torch.allclose(ours, stock, rtol=0.02, atol=0.02)
    real = int(mask.sum())
    assert real % unpadded.ROWS and rows[0] == (-(-real // unpadded.ROWS) * unpadded.ROWS, 32)
    assert rows[1] == (4 * 12, 32)  # topped up to the whole batch, which holds fewer than 64 places
    _outputs(model, batch)  # fp32: the real tokens alone, as before
    assert rows[2] == (real, 32)


def test_the_first_token_alone_only_where_the_head_reads_only_that() -> None:
    config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                  intermediate_size=64)
    assert not first_token.install(AutoModelForTokenClassification.from_config(config))  # reads every token
    assert not unpadded.install(AutoModelForTokenClassification.from_config(config))


def _is_stock(model: torch.nn.Module, attention: str = "sdpa") -> bool:
    """``model`` runs transformers' own forward: no method, layer or attention of nli.model.fastpaths."""
    return (not any("forward" in vars(module) for module in model.modules())
            and not any(isinstance(module, cpu_dropout.CpuDropout) for module in model.modules())
            and model.config._attn_implementation == attention)


def test_fast_paths_are_installed_by_device_compile_switch_and_choice() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # only the device object: the model stays here
    model = _tiny_classifier("bert")
    assert fastpaths.install(model, device=cpu) == ["first_token", "cpu_dropout", "unpadded", "embed_grad"]
    assert "forward" in vars(model.bert.encoder.layer[-1]) and "forward" in vars(model.bert.encoder)
    assert "forward" in vars(model.bert.embeddings.word_embeddings)
    assert model.config._attn_implementation == cpu_dropout.ATTENTION
    with pytest.raises(RuntimeError, match="already installed"):
        fastpaths.install(model, device=cpu)  # once per model

    for device, compiled in ((cuda, False), (cpu, True)):  # a GPU, or a compiled model: the first token alone
        model = _tiny_classifier("roberta")
        assert fastpaths.install(model, device=device, compiled=compiled) == ["first_token"]
        assert "forward" in vars(model.roberta.encoder.layer[-1]) and "forward" not in vars(model.roberta.encoder)
        assert not any(isinstance(m, cpu_dropout.CpuDropout) for m in model.modules())
        assert model.config._attn_implementation == "sdpa"

    for device in (cpu, cuda):  # model.fast_paths=false
        model = _tiny_classifier("bert")
        assert fastpaths.install(model, device=device, enabled=False) == []
        assert _is_stock(model)

    model = _tiny_classifier("bert")
    assert fastpaths.install(model, device=cpu, only={"cpu_dropout"}) == ["cpu_dropout"]
    assert "forward" not in vars(model.bert.encoder.layer[-1]) and "forward" not in vars(model.bert.encoder)
    assert sum(isinstance(m, cpu_dropout.CpuDropout) for m in model.modules()) == 8
    model = _tiny_classifier("bert")
    assert fastpaths.install(model, device=cpu, only=["unpadded", "first_token"]) == ["first_token", "unpadded"]
    assert not any(isinstance(m, cpu_dropout.CpuDropout) for m in model.modules())
    model = _tiny_classifier("bert")
    assert fastpaths.install(model, device=cuda, only=["unpadded"]) == [] and _is_stock(model)
    model = _tiny_classifier("bert")  # trained under DDP, whose reducer waits for the weight's gradient hook
    assert fastpaths.install(model, device=cpu, distributed=True) == ["first_token", "cpu_dropout", "unpadded"]
    assert "forward" not in vars(model.bert.embeddings.word_embeddings)
    model = _tiny_classifier("bert")  # evaluated only (an export, an evaluation-only run): no gradient to keep
    assert fastpaths.install(model, device=cpu, trains=False) == ["first_token", "cpu_dropout", "unpadded"]
    with pytest.raises(ValueError, match="unknown fast path"):
        fastpaths.install(_tiny_classifier("bert"), device=cpu, only=["first-token"])


def test_fast_paths_only_with_the_transformers_they_were_written_for(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    # The module object fastpaths reads: importing some transformers submodules replaces sys.modules' entry.
    monkeypatch.setattr(fastpaths.transformers, "__version__", "5.99.0")
    model = _tiny_classifier("bert")
    before = [model(**batch).logits for batch in _batches()]
    with caplog.at_level(logging.INFO, logger="nli.model.fastpaths"):
        assert fastpaths.install(model, device=torch.device("cpu")) == []
    assert _is_stock(model)
    assert [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "nli.model.fastpaths"] == [
        (logging.WARNING, "fast paths: none installed, the stock forward runs: transformers 5.99.0, not the "
                          "==5.23.* they were written against")]
    for batch, logits in zip(_batches(), before):
        assert torch.equal(model(**batch).logits, logits)
    monkeypatch.setattr(fastpaths.transformers, "__version__", "5.23.4")  # a patch release of the same minor version
    assert fastpaths.install(_tiny_classifier("bert"), device=torch.device("cpu")) == list(fastpaths.PATHS)


def test_fast_paths_only_for_the_architectures_they_were_written_for(caplog: pytest.LogCaptureFixture) -> None:
    config = dict(vocab_size=100, num_labels=3, pad_token_id=1)
    distilbert = AutoModelForSequenceClassification.from_config(AutoConfig.for_model(
        "distilbert", dim=32, n_layers=2, n_heads=2, hidden_dim=64, **config), attn_implementation="sdpa")
    tagger = AutoModelForTokenClassification.from_config(AutoConfig.for_model(  # reads every token's vector
        "bert", hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64, **config),
        attn_implementation="sdpa")
    for model in (distilbert, tagger):
        caplog.clear()
        with caplog.at_level(logging.INFO, logger="nli.model.fastpaths"):
            assert fastpaths.install(model, device=torch.device("cpu")) == []
        assert _is_stock(model)
        lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "nli.model.fastpaths"]
        assert len(lines) == 1 and lines[0][0] == logging.INFO
        assert f"architecture {type(model).__name__} with sdpa attention" in lines[0][1]


def _stock_and_fast(model_type: str, attention: str, dropout: float) -> tuple:
    """The same model twice: as transformers builds it, and with every fast path."""
    stock = _tiny_classifier(model_type, attention, dropout)
    fast = copy.deepcopy(stock)
    assert fastpaths.install(fast, device=torch.device("cpu")) == list(fastpaths.PATHS)
    return stock, fast


@pytest.mark.parametrize("model_type,attention", [("bert", "sdpa"), ("roberta", "eager")])
def test_hidden_states_and_attentions_come_from_the_stock_forward(model_type: str, attention: str) -> None:
    """A call that asks for hidden states (or attentions) gets the stock model's: every layer at
    every position, the same bits, in evaluation and in training (torch's own dropout, same draws)."""
    stock, fast = _stock_and_fast(model_type, attention, dropout=0.1)
    batch = _batches()[0]  # padded: the packed layers would skip the padding
    layers = stock.config.num_hidden_layers
    for train in (False, True):
        stock.train(train), fast.train(train)
        torch.manual_seed(3)
        want = stock(**batch, output_hidden_states=True, output_attentions=attention == "eager")
        torch.manual_seed(3)
        got = fast(**batch, output_hidden_states=True, output_attentions=attention == "eager")
        assert torch.equal(got.logits, want.logits)
        assert len(got.hidden_states) == layers + 1
        for got_layer, want_layer in zip(got.hidden_states, want.hidden_states, strict=True):
            assert got_layer.shape == (4, 12, 32) and torch.equal(got_layer, want_layer)
        if attention == "eager":
            assert len(got.attentions) == layers
            for got_layer, want_layer in zip(got.attentions, want.attentions, strict=True):
                assert torch.equal(got_layer, want_layer)
        hidden = fast.base_model(**batch, output_hidden_states=True).hidden_states  # the base model alone
        assert hidden[-1].shape == (4, 12, 32)
    # The fast paths are back for the next call, and without the flags they run.
    assert "forward" in vars(fast.base_model.encoder.layer[-1]) and "forward" in vars(fast.base_model.encoder)
    assert "forward" in vars(fast.base_model.embeddings.word_embeddings)
    assert sum(isinstance(m, cpu_dropout.CpuDropout) for m in fast.modules()) == 8
    assert fast.config._attn_implementation == (cpu_dropout.ATTENTION if attention == "sdpa" else "eager")
    assert fast.base_model(**batch).last_hidden_state.shape == (4, 1, 32)  # the first token alone
    assert fast.base_model(**batch, output_hidden_states=False).last_hidden_state.shape == (4, 1, 32)
    fast.eval(), stock.eval()
    assert torch.allclose(fast(**batch).logits, stock(**batch).logits, atol=1e-6)


def test_no_fast_paths_for_a_model_configured_to_return_hidden_states(caplog: pytest.LogCaptureFixture) -> None:
    model = _tiny_classifier("bert", output_hidden_states=True)
    with caplog.at_level(logging.INFO, logger="nli.model.fastpaths"):
        assert fastpaths.install(model, device=torch.device("cpu")) == []
    assert _is_stock(model)
    lines = [r.getMessage() for r in caplog.records if r.name == "nli.model.fastpaths"]
    assert len(lines) == 1 and "config sets output_hidden_states" in lines[0]
    assert len(model(**_batches()[0]).hidden_states) == 3


@pytest.mark.process  # what importing does, in a process that has imported nothing else
def test_importing_the_fast_paths_registers_nothing_until_install() -> None:
    script = """
import json
import torch
from transformers import AutoConfig, AutoModelForSequenceClassification
from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
import nli.model.fastpaths, nli.model.build
from nli.model.fastpaths import cpu_dropout
def registered():
    return [cpu_dropout.ATTENTION in ALL_ATTENTION_FUNCTIONS, cpu_dropout.ATTENTION in ALL_MASK_ATTENTION_FUNCTIONS]
imported = registered()
config = AutoConfig.for_model("bert", vocab_size=100, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                              intermediate_size=64)
model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa")
installed = nli.model.fastpaths.install(model, device=torch.device("cpu"))
print(json.dumps({"imported": imported, "installed": installed, "after": registered()}))
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report == {"imported": [False, False], "installed": list(fastpaths.PATHS), "after": [True, True]}


# ------------------------------------------------- the word embeddings' gradient in one buffer (embed_grad)


Batch = Dict[str, torch.Tensor]


def _embed_grad_models() -> Tuple[nn.Module, nn.Module]:
    """A tiny BERT as transformers builds it, and a copy with the buffer installed (nothing else)."""
    config = AutoConfig.for_model("bert", vocab_size=50, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                                  intermediate_size=32, num_labels=2, hidden_dropout_prob=0.0,
                                  attention_probs_dropout_prob=0.0)
    torch.manual_seed(0)
    stock = AutoModelForSequenceClassification.from_config(config).train()
    fast = copy.deepcopy(stock)
    assert fastpaths.install(fast, device=torch.device("cpu"), only=["embed_grad"]) == ["embed_grad"]
    return stock, fast


def _token_batch(seed: int) -> Batch:
    """Eight sequences of 3 to 12 tokens from a 50-word vocabulary (many repeats), padded with id 0."""
    generator = torch.Generator().manual_seed(seed)
    mask = (torch.arange(12) < torch.randint(3, 13, (8, 1), generator=generator)).long()
    ids = torch.randint(1, 50, (8, 12), generator=generator).masked_fill(mask == 0, 0)
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.randint(0, 2, (8,), generator=generator)}


def _sgd_steps(model: nn.Module, steps: List[List[Batch]]) -> Tuple[List[torch.Tensor], List[int]]:
    """SGD over ``steps`` (each a list of micro-batches); the word embeddings' gradient at each step
    (a copy) and where its storage is."""
    weight = model.get_input_embeddings().weight
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    grads, storage = [], []
    for micro_batches in steps:
        for batch in micro_batches:
            model(**batch).loss.backward()
        grads.append(weight.grad.clone())
        storage.append(weight.grad.data_ptr())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return grads, storage


def _buffer_storage(model: nn.Module) -> int:
    """Where the buffer embed_grad keeps for ``model``'s word embeddings is (a small tiny model's fresh
    gradients may land on one address too, so that alone would not tell the buffer was used)."""
    return getattr(model.get_input_embeddings(), embed_grad._BUFFER).grad.data_ptr()


def _assert_same_bits(got: List[torch.Tensor], want: List[torch.Tensor]) -> None:
    for step, (ours, torchs) in enumerate(zip(got, want, strict=True)):
        assert torch.equal(ours.view(torch.int32), torchs.view(torch.int32)), f"step {step}"


def test_the_gradient_is_torchs_to_the_bit_in_storage_allocated_once() -> None:
    stock, fast = _embed_grad_models()
    steps = [[_token_batch(seed)] for seed in range(4)]
    want, _ = _sgd_steps(stock, steps)
    got, storage = _sgd_steps(fast, steps)
    _assert_same_bits(got, want)
    assert storage == [_buffer_storage(fast)] * 4  # every step's gradient is the path's one buffer
    assert all(torch.equal(a, b) for a, b in zip(fast.parameters(), stock.parameters()))  # the same weights after
    assert not got[0][0].any()  # the padding id's row: no gradient, as torch gives it none


def test_micro_batches_accumulate_as_torch_accumulates() -> None:
    stock, fast = _embed_grad_models()
    steps = [[_token_batch(2 * seed), _token_batch(2 * seed + 1), _token_batch(99)] for seed in range(3)]
    want, _ = _sgd_steps(stock, steps)
    got, storage = _sgd_steps(fast, steps)
    _assert_same_bits(got, want)
    assert storage == [_buffer_storage(fast)] * 3


def test_a_gradient_already_there_is_added_to_as_torch_adds() -> None:
    """A weight used elsewhere too (tied) may hold a gradient of that use before this lookup adds its own."""
    stock, fast = _embed_grad_models()
    earlier = torch.randn(50, 16)
    grads = []
    for model in (stock, fast):
        model.get_input_embeddings().weight.grad = earlier.clone()
        model(**_token_batch(0)).loss.backward()
        grads.append(model.get_input_embeddings().weight.grad)
    _assert_same_bits([grads[1]], [grads[0]])


def test_a_gradient_scaled_by_nan_leaves_nothing_in_the_next_step() -> None:
    """Clipping by a NaN norm scales every row, the untouched ones too: the next step starts from zeros."""
    stock, fast = _embed_grad_models()
    weight = fast.get_input_embeddings().weight
    fast(**_token_batch(0)).loss.backward()
    with torch.no_grad():
        weight.grad.mul_(math.nan)
    fast.zero_grad(set_to_none=True)  # no step taken: both models keep the same weights
    for model in (stock, fast):
        model(**_token_batch(1)).loss.backward()
    assert not weight.grad.isnan().any()
    _assert_same_bits([weight.grad], [stock.get_input_embeddings().weight.grad])


def test_without_a_gradient_the_lookup_is_torchs_own() -> None:
    stock, fast = _embed_grad_models()
    batch = _token_batch(0)
    for context in (torch.no_grad, torch.inference_mode):
        with context():
            assert torch.equal(fast(**batch).logits, stock(**batch).logits)
    assert fast.get_input_embeddings().weight.grad is None
    frozen = nn.Embedding(10, 4)
    frozen.weight.requires_grad_(False)
    for embedding in (frozen, nn.Embedding(10, 4, max_norm=1.0), nn.Embedding(10, 4, sparse=True),
                      nn.Embedding(10, 4, scale_grad_by_freq=True)):
        assert not embed_grad.install(embedding) and "forward" not in vars(embedding)


@pytest.mark.parametrize("padding_idx", [None, 3])
def test_a_lookup_alone_gives_torchs_gradient(padding_idx: Optional[int]) -> None:
    torch.manual_seed(0)
    stock = nn.Embedding(20, 8, padding_idx=padding_idx)
    fast = copy.deepcopy(stock)
    assert embed_grad.install(fast)
    ids = torch.tensor([[3, 5, 5, 3, 19], [0, 3, 5, 7, 7]])
    upstream = torch.randn(2, 5, 8)
    for embedding in (stock, fast):
        assert torch.equal(embedding(ids), stock.weight[ids])
        embedding(ids).backward(upstream)
    _assert_same_bits([fast.weight.grad], [stock.weight.grad])
