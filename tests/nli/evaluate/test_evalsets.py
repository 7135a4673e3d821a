"""NLI evaluation sets beyond MNLI: SNLI, ANLI's rounds and HANS, read from their published layouts and
from copies of their Hub datasets; their metrics against values counted by hand; extra evaluations at
the end of a run, in results.json and the sweep's table; and evaluation-only runs. The real train.py
in this process, on the real datasets and Hydra."""

from __future__ import annotations

import csv
import json
import logging
import math
import re
from pathlib import Path
from typing import List, Sequence

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from nli.config.schema import EVAL_SETS, ConfigError
from nli.data import loaders as data
from nli.errors import DataError
from nli.evaluate import evalsets, metrics
from nli.runtime.device import Compute
from nli.runtime.distributed import World
from tests.conftest import build_config
from tests.support.nli_layouts import (
    ANLI,
    ANLI_LABELS,
    HANS,
    SNLI,
    anli_hub_copy,
    constant_classifier,
    hans_by_hand,
    hans_parquet_export,
    snli_hub_copy,
    write_jsonl,
    write_sets,
)
from tests.support.runs import FAST, GLUE_DATA, read_results, run_app

NLI_LABELS = ["entailment", "neutral", "contradiction"]
EXTRAS = ["eval.extra=[snli,anli,hans]"]


def load(overrides: List[str], *, train: bool = False) -> data.Splits:
    cfg = build_config(overrides)
    return data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=False, train=train)


def examples(ds: datasets.Dataset, fields: Sequence[str] = ("premise", "hypothesis", "label")) -> List[tuple]:
    return list(zip(*(ds[name] for name in fields)))


# ------------------------------------------------------------------------------ the task files


def test_each_set_is_a_task_with_its_hub_dataset_and_original_layout() -> None:
    """Written out by hand from the Hub's datasets and the downloads' READMEs."""
    expected = {
        "snli": ("stanfordnlp/snli", "plain_text", None, NLI_LABELS, {"validation": "", "test": "_test"}, "snli_1.0",
                 {"train": "snli_1.0_train.jsonl", "validation": "snli_1.0_dev.jsonl", "test": "snli_1.0_test.jsonl"}),
        "hans": ("jhu-cogsci/hans", None, "refs/convert/parquet", ["entailment", "non-entailment"], {"validation": ""},
                 "hans", {"train": "heuristics_train_set.txt", "validation": "heuristics_evaluation_set.txt"}),
        **{f"anli_r{r}": ("facebook/anli", "plain_text", None, NLI_LABELS, {f"dev_r{r}": "", f"test_r{r}": "_test"},
                          f"anli_v1.0/R{r}", {f"train_r{r}": "train.jsonl", f"dev_r{r}": "dev.jsonl",
                                              f"test_r{r}": "test.jsonl"}) for r in (1, 2, 3)},
    }
    for name, (hub, config, revision, labels, eval_splits, folder, files) in expected.items():
        task = build_config([f"task={name}"]).task
        assert (task.hub_dataset, task.hub_config, task.hub_revision) == (hub, config, revision)
        assert task.label_names == labels
        assert task.eval_splits == eval_splits and task.metrics == ["accuracy"] and not task.test_splits
        assert task.glue is not None and (task.glue.folder, task.glue.files) == (folder, files)
        # What an extra set is: the same file, read outside Hydra.
        assert evalsets.task_config(name) == task
    assert build_config(["task=hans"]).task.groups == ["heuristic"]
    assert build_config(["task=snli"]).task.no_gold_label == "-"
    assert {task for tasks in EVAL_SETS.values() for task in tasks} == {"snli", "anli_r1", "anli_r2", "anli_r3",
                                                                         "hans", "mnli"}


# ------------------------------------------------------------------- the published layouts parse


def test_snli_jsonl_parses_and_its_pairs_without_gold_label_are_dropped_and_counted(
        tmp_path: Path, datasets_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = write_sets(tmp_path / "sets")
    with caplog.at_level(logging.INFO, logger="nli.data.loaders"):
        splits = load(["task=snli", f"data.dir={root}"], train=True)
    for name, ds in [("train", splits.train), ("dev", splits.eval["validation"]), ("test", splits.eval["test"])]:
        gold = [(p, h, NLI_LABELS.index(g)) for g, p, h in SNLI[name] if g != "-"]
        assert examples(ds) == gold, name
    assert "snli validation: 2 of 6 examples have no gold label (label -1, '-' in the original files)" in caplog.text
    assert "snli test: 1 of 4 examples" in caplog.text and "snli train: 1 of 2 examples" in caplog.text


def test_anli_rounds_parse_context_as_premise_and_e_n_c_labels_without_their_training_files(
        tmp_path: Path, datasets_cache: Path) -> None:
    root = write_sets(tmp_path / "sets")  # no train.jsonl: an evaluation reads none
    for r in (1, 2, 3):
        splits = load([f"task=anli_r{r}", f"data.dir={root}"])
        assert splits.train is None and set(splits.eval) == {f"dev_r{r}", f"test_r{r}"}
        for split in ("dev", "test"):
            expected = [(c, h, NLI_LABELS.index(ANLI_LABELS[label])) for label, c, h in ANLI[r][split]]
            assert examples(splits.eval[f"{split}_r{r}"]) == expected
    # A file whose lines name the premise as the Hub's copy does reads the same.
    renamed = [{"uid": "x", "premise": c, "hypothesis": h, "label": label} for label, c, h in ANLI[1]["dev"]]
    write_jsonl(root / "anli_v1.0" / "R1" / "dev.jsonl", renamed)
    assert examples(load(["task=anli_r1", f"data.dir={root}"]).eval["dev_r1"]) == \
        [(c, h, NLI_LABELS.index(ANLI_LABELS[label])) for label, c, h in ANLI[1]["dev"]]


def test_hans_tsv_parses_with_its_heuristic_kept_for_the_metrics(tmp_path: Path, datasets_cache: Path) -> None:
    root = write_sets(tmp_path / "sets")
    splits = load(["task=hans", f"data.dir={root}"])
    validation = splits.eval["validation"]
    assert examples(validation) == [(p, h, 0 if g == "entailment" else 1) for g, _, _, p, h in HANS]
    assert splits.groups == {"validation": {"heuristic": [row[1] for row in HANS]}}


def test_hans_cut_by_max_eval_samples_warns_of_the_heuristics_it_leaves_out(
        tmp_path: Path, datasets_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    """HANS's file lists its examples heuristic by heuristic: its first few are all lexical_overlap, whose accuracy
    would stand as the set's, silently."""
    root = write_sets(tmp_path / "sets")
    with caplog.at_level(logging.WARNING, logger="nli.data.loaders"):
        splits = load(["task=hans", f"data.dir={root}", "data.max_eval_samples=3"])
    assert set(splits.groups["validation"]["heuristic"]) == {"lexical_overlap"}
    assert (f"hans validation: data.max_eval_samples=3 keeps its first 3 of {len(HANS)} examples, and none of "
            "heuristic constituent, subsequence: its accuracy is not the whole set's") in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="nli.data.loaders"):
        load(["task=hans", f"data.dir={root}", "data.max_eval_samples=8"])  # a cut that keeps every heuristic
    assert "max_eval_samples" not in caplog.text


def test_copies_of_the_hub_datasets_give_the_same_examples(tmp_path: Path, datasets_cache: Path) -> None:
    """stanfordnlp/snli (label -1 dropped), facebook/anli (premise column, split per round) and the Parquet
    export of jhu-cogsci/hans (read from its plain_text folder), each as a local copy of its repository."""
    root = write_sets(tmp_path / "sets")
    copies = {"snli": snli_hub_copy(tmp_path / "snli"), "anli_r2": anli_hub_copy(tmp_path / "anli"),
              "hans": hans_parquet_export(tmp_path / "hans")}
    for task, copy in copies.items():
        from_hub = load([f"task={task}", f"task.hub_dataset={copy}"])
        from_files = load([f"task={task}", f"data.dir={root}"])
        assert set(from_hub.eval) == set(from_files.eval)
        for split in from_files.eval:
            assert examples(from_hub.eval[split]) == examples(from_files.eval[split]), (task, split)
        assert from_hub.groups == from_files.groups


# --------------------------------------------------------------------------------- the metrics


def test_hans_accuracies_per_heuristic_and_label_match_values_counted_by_hand() -> None:
    references = np.array([0 if row[0] == "entailment" else 1 for row in HANS])
    predictions = np.array([0, 0, 1, 1, 1, 0, 1, 0, 1, 1])  # ent, ent, non, non, ...
    heuristics = [row[1] for row in HANS]
    scores = metrics.by_group(predictions, references, {"heuristic": heuristics}, ["entailment", "non-entailment"])
    # lexical_overlap: gold e n n, predicted e e n -> 2/3; on entailment 1/1, on non-entailment 1/2.
    # subsequence: gold e n n n, predicted n n e n -> 2/4; 0/1 and 2/3. constituent: gold e e n, predicted
    # e n n -> 2/3; 1/2 and 1/1.
    assert scores == pytest.approx({
        "accuracy_lexical_overlap": 2 / 3, "accuracy_lexical_overlap_entailment": 1.0,
        "accuracy_lexical_overlap_non-entailment": 0.5, "accuracy_subsequence": 0.5,
        "accuracy_subsequence_entailment": 0.0, "accuracy_subsequence_non-entailment": 2 / 3,
        "accuracy_constituent": 2 / 3, "accuracy_constituent_entailment": 0.5,
        "accuracy_constituent_non-entailment": 1.0})
    # The tests' own count (used on real runs below) agrees.
    by_hand = hans_by_hand(["entailment" if p == 0 else "non-entailment" for p in predictions])
    assert {k: v for k, v in by_hand.items() if k != "accuracy"} == pytest.approx(scores)
    assert by_hand["accuracy"] == pytest.approx(6 / 10)


@pytest.mark.parametrize(("device", "pinned", "kept"), [("cpu", False, False), ("cuda", True, True)])
def test_a_sets_eval_and_test_loaders_take_data_num_workers_as_the_runs_device_takes_them(device: str, pinned: bool,
                                                                                          kept: bool) -> None:
    """evalsets.from_splits, which builds every set's loaders (the run's own, eval.extra's, test predictions'),
    asks data.Workers.on with the run's device and data.num_workers: a loader built with the defaults instead
    would load on the main process and never keep its workers on a GPU. Only built here, never iterated (no GPU)."""
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (5, 9, 2)], "labels": [0, 1, 0]})
    splits = data.Splits(train=None, eval={"validation": ds}, test={"test": ds.remove_columns("labels")})
    scoring = evalsets.Scoring(tokenizer=None,  # type: ignore[arg-type]  # building loaders reads no text
                               collator=lambda rows: rows, labels=["entailment", "not_entailment"], model="a model",
                               compute=Compute(torch.device(device), torch.float32), world=World(), batch_size=2,
                               num_workers=2, seed=0)
    made = evalsets.from_splits(build_config(["task=rte"]).task, splits, {"validation": ds}, scoring)
    loaders = [*made.evaluate.evaluator.loaders.values(), *made.test.values()]
    assert len(loaders) == 2
    assert [(each.num_workers, each.pin_memory, each.persistent_workers) for each in loaders] == [(2, pinned, kept)] * 2


def test_a_models_labels_count_as_a_sets_by_name() -> None:
    hans, snli = build_config(["task=hans"]).task, build_config(["task=snli"]).task
    # roberta-large-mnli's order and case; HANS takes neutral and contradiction as non-entailment.
    assert evalsets.label_map(["CONTRADICTION", "NEUTRAL", "ENTAILMENT"], snli, model="m").tolist() == [2, 1, 0]
    assert evalsets.label_map(["CONTRADICTION", "NEUTRAL", "ENTAILMENT"], hans, model="m").tolist() == [1, 1, 0]
    assert evalsets.label_map(["entailment", "neutral", "contradiction"], snli, model="m") is None  # the same ids
    assert evalsets.label_map(["entailment", "not_entailment"], hans, model="m") is None  # RTE's names it alike
    assert evalsets.label_map(["not_entailment", "entailment"], hans, model="m").tolist() == [1, 0]  # WNLI's order
    with pytest.raises(ConfigError, match=re.escape("m predicts the labels ['positive', 'negative'], and task hans "
                                                    "has the labels ['entailment', 'non-entailment']: ['positive', "
                                                    "'negative'] match none of them by name")):
        evalsets.label_map(["positive", "negative"], hans, model="m")
    with pytest.raises(ConfigError, match=r"\['not_entailment'\] match none of them"):  # RTE's model on SNLI
        evalsets.label_map(["entailment", "not_entailment"], snli, model="m")
    with pytest.raises(ConfigError, match="unnamed labels"):
        evalsets.label_map(["LABEL_0", "LABEL_1", "LABEL_2"], hans, model="m")
    with pytest.raises(ConfigError, match="m predicts a score, and task hans is a classification"):  # an STS-B model
        evalsets.label_map([], hans, model="m")


# ------------------------------------------------------------------------------------- errors


def test_an_unknown_extra_set_is_refused_before_anything_loads() -> None:
    with pytest.raises(ConfigError, match=re.escape("eval.extra=['hans', 'fever']: unknown evaluation set(s) "
                                                    "['fever']; known: anli, anli_r1, anli_r2, anli_r3, hans, "
                                                    "mnli, snli")):
        build_config(["eval.extra=[hans,fever]"])
    with pytest.raises(ConfigError, match="names task=mnli, the run's own task"):
        build_config(["eval.extra=[mnli]"])
    with pytest.raises(ConfigError, match="eval.only=true evaluates a trained model"):
        build_config(["experiment=quickstart", "eval.only=true"])
    with pytest.raises(ConfigError, match="task=stsb is a regression: its model has none"):
        build_config(["task=stsb", "eval.extra=[hans]"])
    with pytest.raises(ConfigError, match=re.escape("eval.dir=/data/nli says where the sets of eval.extra are")):
        build_config(["eval.dir=/data/nli"])


def test_a_file_with_an_unknown_label_or_a_bad_line_names_it(tmp_path: Path, datasets_cache: Path) -> None:
    root = write_sets(tmp_path / "sets")
    dev = root / "anli_v1.0" / "R2" / "dev.jsonl"
    dev.write_text(dev.read_text().replace('"label": "n"', '"label": "x"'))
    with pytest.raises(DataError, match=re.escape(f"{dev}, line 2: unknown label 'x' for task anli_r2; known labels: "
                                                   "entailment, neutral, contradiction, e, n, c")):
        load(["task=anli_r2", f"data.dir={root}"])
    test = root / "snli_1.0" / "snli_1.0_test.jsonl"
    test.write_text(test.read_text() + '{"gold_label": "entailment", "sentence1": "a"\n')
    with pytest.raises(DataError, match=re.escape(f"{test}, line 5: not valid JSON")):
        load(["task=snli", f"data.dir={root}"])
    hans = root / "hans" / "heuristics_evaluation_set.txt"
    hans.write_text(hans.read_text().replace("\theuristic\t", "\tkind\t", 1))
    with pytest.raises(DataError, match=re.escape(f"{hans}: no column 'heuristic'; its header (line 1) has")):
        load(["task=hans", f"data.dir={root}"])


# ------------------------------------------------------------------------- real runs of train.py


def run(args: List[str], cwd: Path) -> str:
    proc = run_app(args, cwd=cwd)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sweep of one job: the quickstart with SNLI, ANLI and HANS as extra sets, from their original files."""
    tmp = tmp_path_factory.mktemp("sweep")
    sets = write_sets(tmp / "sets")
    run(["-m", *FAST, *EXTRAS, f"eval.dir={sets}", "seed=3", f"hydra.sweep.dir={tmp / 'sweep'}"], tmp)
    return tmp / "sweep"


def predict_by_hand(model_dir: Path, pairs: List[tuple]) -> List[str]:
    """The exported model's answers (its own label names), read with transformers alone."""
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForSequenceClassification.from_pretrained(model_dir).eval()
    with torch.no_grad():
        batch = tokenizer([p for p, _ in pairs], [h for _, h in pairs], padding=True, return_tensors="pt")
        ids = model(**batch).logits.argmax(-1).tolist()
    return [model.config.id2label[i] for i in ids]


def test_extra_sets_are_scored_at_the_end_of_a_run_keyed_by_set_in_results_and_the_sweeps_table(sweep: Path) -> None:
    results = read_results(sweep / "0")
    answers = predict_by_hand(sweep / "0" / "model", [(row[3], row[4]) for row in HANS])
    hans = {f"hans/{key}": value for key, value in
            hans_by_hand(["entailment" if a == "entailment" else "non-entailment" for a in answers]).items()}
    assert {key: results[key] for key in hans} == pytest.approx(hans)
    gold = [(g, p, h) for g, p, h in SNLI["dev"] if g != "-"]
    snli = predict_by_hand(sweep / "0" / "model", [(p, h) for _, p, h in gold])
    assert results["snli/accuracy"] == pytest.approx(sum(a == g for a, (g, _, _) in zip(snli, gold)) / len(gold))
    anli = [f"anli_r{r}/accuracy{suffix}" for r in (1, 2, 3) for suffix in ("", "_test")]
    keys = {"snli/accuracy", "snli/accuracy_test", *anli, *hans}
    assert keys <= set(results) and results["objective"] == results["accuracy"]  # the task's own, unprefixed
    with open(sweep / "sweep_results.csv", newline="") as f:
        (row,) = list(csv.DictReader(f))
    assert keys <= set(row) and float(row["hans/accuracy_lexical_overlap_non-entailment"]) == pytest.approx(
        results["hans/accuracy_lexical_overlap_non-entailment"])
    logged = (sweep / "0" / "metrics.csv").read_text()
    assert f"12,eval/hans/accuracy,{results['hans/accuracy']}" in logged  # to the loggers, at the last step


def test_an_evaluation_only_run_of_a_run_folder_gives_its_results_without_training(sweep: Path, tmp_path: Path) -> None:
    trained = sweep / "0"
    out = tmp_path / "eval"
    args = [*FAST, *EXTRAS, f"eval.dir={sweep.parent / 'sets'}", "model=roberta-base", f"model.name_or_path={trained}",
            "eval.only=true", f"hydra.run.dir={out}"]
    log = run(args, tmp_path)
    results, earlier = read_results(out), read_results(trained)
    metrics_of = {key: value for key, value in earlier.items() if key == "accuracy" or "/" in key}
    assert {key: results[key] for key in metrics_of} == pytest.approx(metrics_of, abs=1e-9)
    assert results["objective"] == earlier["objective"] and results["evaluated_model"] == str(trained / "model")
    assert results["task"] == earlier["task"] == "synthetic"
    assert not any(key.startswith(("train_", "best_step")) for key in results) and results["status"] == "completed"
    assert f"model.name_or_path={trained} is a run folder: evaluating the model it exported, {trained / 'model'}" in log
    assert "data: synthetic, no training set; eval validation=96" in log and "tokenize train" not in log
    assert not re.search(r"step \d+: loss", log) and not (out / "checkpoints").exists()
    # The folder holds this evaluation: asked again, it answers from there; with other settings, it refuses.
    assert "this run already finished" in run(args, tmp_path)
    other = run_app([*args, "eval.extra=[hans]"], cwd=tmp_path)
    assert other.returncode == 1 and "eval.extra: " in other.stderr and "holds a finished run" in other.stderr


def test_an_evaluation_only_run_of_a_model_with_fixed_answers_scores_by_hand(tmp_path: Path) -> None:
    """A model that always answers CONTRADICTION, its labels in roberta-large-mnli's order and case: on HANS
    it is always non-entailment, on SNLI and RTE matched by name; RTE's test predictions are written."""
    model = constant_classifier(tmp_path / "model", ["CONTRADICTION", "NEUTRAL", "ENTAILMENT"], "CONTRADICTION")
    sets = write_sets(tmp_path / "sets")
    out = tmp_path / "eval"
    run(["task=rte", f"data.dir={GLUE_DATA}", "model=roberta-base", f"model.name_or_path={model}", "eval.only=true",
         "train.predict=true", "eval.extra=[hans,snli]", f"eval.dir={sets}", "train.progress_bar=false",
         f"hydra.run.dir={out}"], tmp_path)
    results = read_results(out)
    with open(GLUE_DATA / "RTE" / "dev.tsv", newline="") as f:
        rte = [row["label"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    assert results["accuracy"] == pytest.approx(rte.count("not_entailment") / len(rte))
    # HANS: 6 of 10 pairs are non-entailment; lexical overlap 2 of 3, subsequence 3 of 4, constituent 1 of 3.
    assert {key: value for key, value in results.items()
            if key.startswith("hans/") and key not in ("hans/loss", "hans/ece", "hans/brier")} == \
        pytest.approx({
        "hans/accuracy": 0.6, "hans/accuracy_lexical_overlap": 2 / 3, "hans/accuracy_subsequence": 3 / 4,
        "hans/accuracy_constituent": 1 / 3, **{f"hans/accuracy_{h}_entailment": 0.0 for h in
                                               ("lexical_overlap", "subsequence", "constituent")},
        **{f"hans/accuracy_{h}_non-entailment": 1.0 for h in ("lexical_overlap", "subsequence", "constituent")}})
    # SNLI: contradiction is 2 of the 4 gold-labelled dev pairs, 1 of the 3 test pairs.
    assert (results["snli/accuracy"], results["snli/accuracy_test"]) == pytest.approx((0.5, 1 / 3))
    with open(GLUE_DATA / "RTE" / "test.tsv", newline="") as f:
        indices = [row["index"] for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    lines = (out / "predictions" / "RTE.tsv").read_text().splitlines()
    assert lines == ["index\tprediction", *(f"{index}\tnot_entailment" for index in indices)]
    # On HANS, each label's probability is the sum of those of the model's labels that count as it: its bias of
    # 5 on CONTRADICTION gives non-entailment (e^5 + 1) / (e^5 + 2), and the loss is their cross-entropy.
    entailed = 1 / (math.exp(5) + 2)
    hans_file = out / "eval_predictions" / "hans" / "validation.jsonl"
    hans = [json.loads(line) for line in hans_file.read_text().splitlines()]
    assert [(row["label"], row["heuristic"], row["premise"]) for row in hans] == [(g, h, p) for g, h, _, p, _ in HANS]
    assert {row["prediction"] for row in hans} == {"non-entailment"}
    assert [row["probability_entailment"] for row in hans] == pytest.approx([entailed] * 10)
    assert [row["probability_non-entailment"] for row in hans] == pytest.approx([1 - entailed] * 10)
    assert results["hans/loss"] == pytest.approx(-(4 * math.log(entailed) + 6 * math.log(1 - entailed)) / 10)
    assert results["confusion_matrix"]["hans/validation"] == {"labels": ["entailment", "non-entailment"],
                                                              "matrix": [[0, 4], [0, 6]]}
    assert results["per_class"]["hans/validation"]["non-entailment"] == {"precision": 0.6, "recall": 1.0,
                                                                         "f1": pytest.approx(0.75), "support": 6}
    assert set(results["per_class"]) == {"validation", "hans/validation", "snli/validation", "snli/test"}
    # Calibration: every HANS pair is non-entailment at 1 - entailed, in the last of the 15 bins, and 6 in 10 are: the
    # ECE is the gap; Brier is 2 (1 - entailed)^2 for each entailed pair and 2 entailed^2 for each other.
    assert (results["hans/ece"], results["hans/brier"]) == pytest.approx(
        (1 - entailed - 0.6, (4 * 2 * (1 - entailed) ** 2 + 6 * 2 * entailed ** 2) / 10))
    sure = math.exp(5) / (math.exp(5) + 2)  # SNLI's labels are the model's own: contradiction at this, 2 in 4 right
    assert results["snli/ece"] == pytest.approx(sure - 0.5)
    hans_calibration = results["calibration"]["hans/validation"]
    assert set(results["calibration"]) == set(results["per_class"]) and hans_calibration["count"] == [0] * 14 + [10]
    # The temperature, fitted on RTE's dev set: for a model that answers alike whatever it reads, the likelihood
    # grows all the way to the highest temperature looked at, 20 (not_entailment's probability falls toward 2/3,
    # still above its share); on HANS, non-entailment's probability is then (e^0.25 + 1) / (e^0.25 + 2).
    assert hans_calibration["temperature"] == pytest.approx(20, rel=1e-5)
    assert hans_calibration["temperature_fitted_on"] == "validation"
    tempered = (math.exp(0.25) + 1) / (math.exp(0.25) + 2)
    assert hans_calibration["ece_after_temperature"] == pytest.approx(tempered - 0.6)
    assert hans_calibration["brier_after_temperature"] == pytest.approx((8 * tempered ** 2 + 12 * (1 - tempered) ** 2)
                                                                        / 10)


def test_a_model_whose_labels_match_no_sets_is_refused_before_evaluating(tmp_path: Path) -> None:
    model = constant_classifier(tmp_path / "model", ["negative", "positive"], "positive")
    proc = run_app(["task=hans", f"data.dir={write_sets(tmp_path / 'sets')}", "model=roberta-base",
                      f"model.name_or_path={model}", "eval.only=true", f"hydra.run.dir={tmp_path / 'eval'}"],
                   cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: model.name_or_path={model} predicts the labels ['negative', 'positive'], and task hans has the "
            "labels ['entailment', 'non-entailment']: ['negative', 'positive'] match none of them by name"
            ) in proc.stderr
    assert "data: hans" not in proc.stdout + proc.stderr  # refused before the set loaded


def test_an_extra_set_the_hub_cannot_give_names_eval_dir_as_the_way_offline(tmp_path: Path) -> None:
    """Without eval.dir an extra set comes from the Hub; unreachable, the advice was to point data.dir at a GLUE
    directory, which the run had (its own task's), and the dataset was named "'jhu-cogsci/hans' (None)"."""
    proc = run_app([*FAST, "eval.extra=[hans]", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                   env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": None})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert ("error: cannot download dataset 'jhu-cogsci/hans': http://127.0.0.1:9 is not reachable. To run offline: "
            "set eval.dir to a folder holding hans's original download (hans/ with heuristics_evaluation_set.txt), "
            "load it from the Hugging Face cache with HF_HUB_OFFLINE=1 where a run downloaded it, or leave hans out of "
            "eval.extra.\n") in proc.stderr, proc.stderr


def test_a_missing_extra_file_stops_the_run_before_training(tmp_path: Path) -> None:
    """The message lists the files the sets are read from: an extra set's training file is never read, and was
    listed as expected."""
    sets = write_sets(tmp_path / "sets")
    (sets / "hans" / "heuristics_evaluation_set.txt").unlink()
    proc = run_app([*FAST, "eval.extra=[hans]", f"eval.dir={sets}", f"hydra.run.dir={tmp_path / 'run'}"],
                   cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert (f"error: eval.dir={sets}: {sets / 'hans' / 'heuristics_evaluation_set.txt'} does not exist. eval.dir "
            "holds each set's original download, unpacked, in a folder of its own (hans/ for hans, with the files "
            "heuristics_evaluation_set.txt): put them there, or set eval.dir=null to load hans from the Hub "
            "(jhu-cogsci/hans)") in proc.stderr
    assert not re.search(r"step \d+: loss", proc.stdout + proc.stderr)
