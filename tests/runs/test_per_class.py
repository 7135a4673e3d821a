"""What a researcher looks at after a run (nli/evaluate/per_class.py), through real runs of train.py: each class's
precision, recall and F1 and the confusion matrix in results.json and in every logger, each eval example's
prediction in eval_predictions/, and the evaluation loss and calibration at every evaluation; all read back as a reader
would (pandas, datasets, TensorBoard's EventAccumulator, W&B's offline run file)."""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any, Dict, List

import datasets
import numpy as np
import pandas
import pytest
from huggingface_hub import ModelCard
from sklearn.metrics import precision_recall_fscore_support

from nli.evaluate import per_class
from tests.runs.test_glue import TINY, mnli_dir
from tests.support.runs import FAST, GLUE_DATA, read_results, run_app
from tests.support.wandb_records import records

LABELS = ["entailment", "neutral", "contradiction"]
SPLITS = {"validation_matched": ("", 48), "validation_mismatched": ("_mm", 40)}  # split -> (suffix, examples)


@pytest.fixture(scope="module")
def mnli_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """MNLI in GLUE's layout (two dev splits, three classes), logged by all three loggers (W&B offline)."""
    tmp = tmp_path_factory.mktemp("mnli")
    out = tmp / "run"
    proc = run_app(["task=mnli", f"data.dir={mnli_dir(tmp / 'glue_data')}", *TINY, "train.max_steps=8",
                    "train.eval_every=4", "optimizer.lr=3e-3", "logger=[csv,tensorboard,wandb]",
                    "logger.wandb.mode=offline", f"hydra.run.dir={out}"], cwd=tmp, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def read_jsonl(path: Path) -> List[Dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_each_dev_split_has_its_predictions_per_class_figures_and_confusion_matrix(mnli_run: Path) -> None:
    results = read_results(mnli_run)
    assert set(results["per_class"]) == set(results["confusion_matrix"]) == set(SPLITS)
    for split, (suffix, size) in SPLITS.items():
        path = mnli_run / "eval_predictions" / f"{split}.jsonl"
        rows = read_jsonl(path)
        assert len(rows) == size and [row["idx"] for row in rows] == list(range(size))
        assert set(rows[0]) == {"idx", "premise", "hypothesis", "label", "prediction",
                                *(f"probability_{label}" for label in LABELS)}
        gold, predicted = [row["label"] for row in rows], [row["prediction"] for row in rows]
        # The file's own accuracy is the one reported.
        assert sum(g == p for g, p in zip(gold, predicted)) / size == results[f"accuracy{suffix}"]
        # Each class's figures, recomputed from the file, are results.json's.
        figures = precision_recall_fscore_support(gold, predicted, labels=LABELS, zero_division=0)
        assert results["per_class"][split] == {label: {"precision": pytest.approx(figures[0][i]),
                                                       "recall": pytest.approx(figures[1][i]),
                                                       "f1": pytest.approx(figures[2][i]), "support": figures[3][i]}
                                               for i, label in enumerate(LABELS)}
        matrix = results["confusion_matrix"][split]
        assert matrix["labels"] == LABELS and sum(map(sum, matrix["matrix"])) == size
        assert matrix["matrix"] == [[sum(g == a and p == b for g, p in zip(gold, predicted)) for b in LABELS]
                                    for a in LABELS]  # rows gold, columns predicted
        # The probabilities are a softmax whose most probable class is the prediction; their cross-entropy
        # is the reported loss.
        probabilities = np.array([[row[f"probability_{label}"] for label in LABELS] for row in rows])
        assert probabilities.sum(axis=1) == pytest.approx(np.ones(size), abs=1e-5)
        assert [LABELS[i] for i in probabilities.argmax(axis=1)] == predicted
        cross_entropy = -np.mean(np.log([p[LABELS.index(g)] for p, g in zip(probabilities, gold)]))
        assert results[f"loss{suffix}"] == pytest.approx(cross_entropy, rel=1e-5)
        assert_calibration(results, split, suffix, probabilities, [LABELS.index(g) for g in gold])
        # pandas and datasets read the file as it is.
        frame = pandas.read_json(path, lines=True)
        assert list(frame["prediction"]) == predicted
        loaded = datasets.load_dataset("json", data_files=str(path), split="train")
        assert loaded["label"] == gold and loaded.num_rows == size


def assert_calibration(results: Dict[str, Any], split: str, suffix: str, probabilities: np.ndarray,
                       gold: List[int]) -> None:
    """The split's ECE (15 equal-width bins) and Brier score, recomputed from its predictions file, are results.json's,
    and so are its reliability bins; the temperature is fitted on the main split and changes no prediction."""
    predicted = probabilities.argmax(axis=1)
    confidences = probabilities[np.arange(len(gold)), predicted]
    members: Dict[int, List[int]] = {}
    for i, each in enumerate(confidences):  # bin b holds (b/15, (b+1)/15]
        members.setdefault(max(math.ceil(each * 15) - 1, 0), []).append(i)
    gaps = [len(bin) * abs(np.mean([predicted[i] == gold[i] for i in bin]) - np.mean(confidences[bin]))
            for bin in members.values()]
    assert results[f"ece{suffix}"] == pytest.approx(sum(gaps) / len(gold), abs=1e-5)
    brier = np.mean([sum((p - (c == g)) ** 2 for c, p in enumerate(row)) for row, g in zip(probabilities, gold)])
    assert results[f"brier{suffix}"] == pytest.approx(brier, abs=1e-5)
    figures = results["calibration"][split]
    assert figures["bins"] == 15 and len(figures["count"]) == len(figures["accuracy"]) == 15
    assert figures["count"] == [len(members.get(b, [])) for b in range(15)] and sum(figures["count"]) == len(gold)
    assert (figures["ece"], figures["brier"]) == (results[f"ece{suffix}"], results[f"brier{suffix}"])
    assert figures["temperature_fitted_on"] == "validation_matched" and figures["temperature"] > 0
    assert figures["temperature"] == results["calibration"]["validation_matched"]["temperature"]
    assert 0 <= figures["ece_after_temperature"] <= 1 and 0 <= figures["brier_after_temperature"] <= 2


def test_the_loggers_hold_the_loss_the_per_class_figures_and_the_confusion_matrices(mnli_run: Path) -> None:
    results = read_results(mnli_run)
    with open(mnli_run / "metrics.csv", newline="") as stream:
        logged = list(csv.DictReader(stream))
    for suffix in ("", "_mm"):  # at every evaluation, the calibration figures with the loss
        for name in ("loss", "ece", "brier"):
            assert [int(row["step"]) for row in logged if row["metric"] == f"eval/{name}{suffix}"] == [4, 8]
        assert float(next(row["value"] for row in logged if row["metric"] == f"eval/ece{suffix}"
                          and int(row["step"]) == results["best_step"])) == results[f"ece{suffix}"]
    with open(mnli_run / "per_class.csv", newline="") as stream:
        per_class = list(csv.DictReader(stream))
    assert {(row["split"], row["label"]): {key: float(row[key]) for key in ("precision", "recall", "f1", "support")}
            for row in per_class} == {(split, label): pytest.approx(figures)
                                      for split, table in results["per_class"].items()
                                      for label, figures in table.items()}
    with open(mnli_run / "confusion.csv", newline="") as stream:
        cells = list(csv.DictReader(stream))
    assert len(cells) == 2 * 9 and {
        (row["split"], row["gold"], row["predicted"]): int(row["count"]) for row in cells} == {
        (split, gold, predicted): matrix["matrix"][i][j] for split, matrix in results["confusion_matrix"].items()
        for i, gold in enumerate(LABELS) for j, predicted in enumerate(LABELS)}

    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(mnli_run / "tensorboard"), size_guidance={"tensors": 0})
    events.Reload()
    assert [event.step for event in events.Scalars("eval/loss_mm")] == [4, 8]
    text = {tag: events.Tensors(tag)[-1].tensor_proto.string_val[0].decode() for tag in events.Tags()["tensors"]}
    matched = text["eval/confusion_matrix/validation_matched/text_summary"]
    assert matched.splitlines()[0] == "| gold \\ predicted | entailment | neutral | contradiction |"
    first = results["confusion_matrix"]["validation_matched"]["matrix"][0]
    assert f"| entailment | {' | '.join(map(str, first))} |" in matched
    assert "| neutral |" in text["eval/per_class/validation_mismatched/text_summary"]

    (run_file,) = (mnli_run / "wandb").glob("offline-run-*/run-*.wandb")
    logged_wandb: Dict[str, Dict[str, Any]] = {}  # key -> its value, or a table's fields (path, nrows, ...)
    for record in records(run_file):
        if record.WhichOneof("record_type") == "history":
            for item in record.history.item:
                key, *field = list(item.nested_key) or [item.key]
                logged_wandb.setdefault(key, {})[field[0] if field else ""] = json.loads(item.value_json)
    assert {"eval/loss", "eval/loss_mm"} <= set(logged_wandb)
    for split in SPLITS:  # W&B's tables, in its run folder's files, hold the figures and the counts
        per_class_table = json.loads((run_file.parent / "files" / logged_wandb[f"eval/per_class/{split}"]["path"])
                                     .read_text())
        assert per_class_table["columns"] == ["label", "precision", "recall", "f1", "support"]
        assert {row[0]: dict(zip(per_class_table["columns"][1:], row[1:])) for row in per_class_table["data"]} == \
            results["per_class"][split]
        chart = logged_wandb[f"eval/confusion_matrix/{split}_table"]  # wandb.plot.confusion_matrix's own table
        cells = json.loads((run_file.parent / "files" / chart["path"]).read_text())
        assert cells["columns"] == ["Actual", "Predicted", "nPredictions"]
        matrix = results["confusion_matrix"][split]["matrix"]
        assert cells["data"] == [[gold, predicted, matrix[i][j]] for i, gold in enumerate(LABELS)
                                 for j, predicted in enumerate(LABELS)]


def test_no_predictions_files_with_save_predictions_false_and_a_wrong_value_is_one_line(tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = run_app([*FAST, "eval.save_predictions=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (out / "eval_predictions").exists() and "eval predictions" not in proc.stdout
    results = read_results(out)
    assert set(results["per_class"]) == {"validation"} and math.isfinite(results["loss"])  # the figures stay

    wrong = run_app([*FAST, "eval.save_predictions=sometimes", f"hydra.run.dir={tmp_path / 'wrong'}"], cwd=tmp_path)
    assert wrong.returncode == 1 and "Traceback" not in wrong.stderr
    assert wrong.stderr == "error: eval.save_predictions=sometimes: Value 'sometimes' is not a valid bool (type str)\n"
    assert not (tmp_path / "wrong").exists()


def test_the_readmes_offline_rte_run_says_its_model_predicts_one_class(tmp_path: Path) -> None:
    """README.md's offline RTE example: a tiny model from scratch learns nothing of RTE's 2,490 pairs and predicts
    one class, which its 0.50 accuracy did not say. The run says it, in its log, results.json's warnings and the
    exported model's card."""
    out = tmp_path / "rte"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "train.progress_bar=false",
                    f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out)
    (predicted,) = {j for row in results["confusion_matrix"]["validation"]["matrix"] for j, n in enumerate(row) if n}
    label = results["confusion_matrix"]["validation"]["labels"][predicted]
    said = (f"validation: the model predicts {label} for all 139 examples, so its accuracy ({results['accuracy']:.4f})"
            " is that class's share: it has learnt nothing the labels' counts do not give. Train longer or at another "
            "learning rate, or start from a pretrained model")
    assert results["warnings"] == [said]
    assert f"[WARNING] - {said}\n" in proc.stdout
    card = ModelCard.load(out / "model" / "README.md")  # the model handed on says so too, beside its accuracy
    assert f"## Warnings\n\n- {said}\n" in card.text


def test_a_model_that_predicts_several_classes_gets_no_such_warning() -> None:
    analysis = per_class.SplitAnalysis(split="validation", labels=["entailment", "not_entailment"],
                                       per_class={}, matrix=[[60, 10], [50, 19]])
    assert per_class.one_class(analysis) is None
    alone = per_class.SplitAnalysis(split="validation", labels=["a", "b", "c"], per_class={},
                                    matrix=[[0, 5, 0], [0, 0, 0], [0, 0, 0]])  # one gold class: nothing to tell apart
    assert per_class.one_class(alone) is None


def test_a_label_without_gold_examples_in_the_evaluated_slice_is_said_so(tmp_path: Path) -> None:
    """RTE's first three dev pairs are all not_entailment: on them entailment's recall and F1 are 0 of 0, which
    per_class gives as 0, a model that never finds entailment to a reader of results.json, the report or the card. The
    run says the split has no example of the label, in its log, results.json's warnings and the card."""
    out = tmp_path / "rte"
    proc = run_app(["task=rte", f"data.dir={GLUE_DATA}", "model=tiny", "data.max_seq_length=64",
                    "data.max_train_samples=32", "data.max_eval_samples=3", "train.max_steps=2",
                    "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(out)
    assert results["per_class"]["validation"]["entailment"]["support"] == 0
    assert results["per_class"]["validation"]["entailment"]["recall"] == 0.0
    said = ("validation: none of its 3 examples is labelled entailment, so that label's recall and F1 (0 in "
            "results.json's per_class) say nothing of the model: evaluate on more of the split (data.max_eval_samples) "
            "or on examples of every label")
    assert said in results["warnings"] and f"[WARNING] - {said}\n" in proc.stdout
    assert f"- {said}\n" in ModelCard.load(out / "model" / "README.md").text


def test_every_label_with_gold_examples_gets_no_such_warning() -> None:
    whole = per_class.SplitAnalysis(split="validation", labels=["a", "b", "c"], per_class={},
                                    matrix=[[3, 0, 1], [0, 0, 2], [1, 1, 1]])
    assert per_class.absent(whole) is None
    one = per_class.SplitAnalysis(split="hans/validation", labels=["a", "b", "c"], per_class={},
                                  matrix=[[0, 0, 0], [0, 0, 1], [0, 0, 0]])
    assert per_class.absent(one) == ("hans/validation: its one example is not labelled a or c, so those labels' "
                                     "recall and F1 (0 in results.json's per_class) say nothing of the model: evaluate "
                                     "on more of the split (data.max_eval_samples) or on examples of every label")
