"""Evaluation at its speed: eval batches grouped by length give the predictions and metrics of batches in
the split's order (in one process or split over ranks), evaluation-only runs use the fast paths, and the
end of a run reuses the best checkpoint's evaluation where this process made it, with the figures a fresh
evaluation of the exported model gives."""

from __future__ import annotations

import csv
import dataclasses
import functools
import json
import os
import random
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import datasets
import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, DataCollatorWithPadding, PreTrainedTokenizerFast

from nli.data import loaders as data
from nli.evaluate.evaluation import Predictions, gather, predict
from nli.runtime.distributed import World
from tests.conftest import build_config
from tests.runs.test_folder import STILL
from tests.support.glue_layouts import stsb_dir, stsb_with_one_gold_score
from tests.support.runs import FAST, copy_run, read_results, run_app

ShareRun = Callable[[str, Sequence[str]], Path]
EVAL = ["eval.only=true", "train.progress_bar=false"]
REUSED = "was evaluated at its step; that evaluation is its final one"


# ------------------------------------------------------------------------- length groups, in order


def test_length_groups_batch_by_length_and_restore_each_ranks_slice_to_the_splits_order() -> None:
    """Two ranks each predict their contiguous slice in batches of one length, longest first; each puts
    its predictions back in its slice's order, and the slices joined in rank order are the split's."""
    rng = random.Random(0)
    lengths = [rng.randint(3, 40) for _ in range(23)]
    ds = datasets.Dataset.from_dict({"input_ids": [[7] * n for n in lengths], "labels": list(range(23))})
    joined = []
    for rank in (0, 1):
        loader = data.eval_loader(ds, lambda rows: rows, batch_size=4, world=World(rank=rank, world_size=2))
        batches = list(loader)
        seen = [[len(row["input_ids"]) for row in batch] for batch in batches]
        flat = [n for batch in seen for n in batch]
        assert flat == sorted(flat, reverse=True) and all(len(batch) <= 4 for batch in seen)
        # What predict() returns: one row per example in the loader's order (a 2-D array: logits).
        made = np.array([row["labels"] for batch in batches for row in batch])
        ordered = data.in_split_order(loader, Predictions(values=np.stack([made, -made], axis=1), labels=made,
                                                          idx=None))
        joined.append(ordered)
    assert np.concatenate([p.labels for p in joined]).tolist() == list(range(23))
    assert np.concatenate([p.values for p in joined]).tolist() == [[i, -i] for i in range(23)]


def test_ungrouped_loaders_keep_the_splits_order() -> None:
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (5, 9, 2)], "labels": [0, 1, 2]})
    loader = data.eval_loader(ds, lambda rows: rows, batch_size=2, world=World(), grouped=False)
    assert [row["labels"] for batch in loader for row in batch] == [0, 1, 2]
    assert data.in_split_order(loader, "anything") == "anything"


@pytest.mark.parametrize("grouped", [True, False])
@pytest.mark.parametrize("keep", [True, False])
def test_an_eval_loaders_workers_are_kept_from_one_evaluation_to_the_next_where_asked(grouped: bool, keep: bool
                                                                                      ) -> None:
    """With data.num_workers (two by default on a GPU), every evaluation forked its workers anew: on a GPU's
    four batches of 512 dev pairs that cost more than it saved. Where kept, the same processes serve each pass;
    each pass still yields every example once, in the same batches."""
    ds = datasets.Dataset.from_dict({"input_ids": [[1] * n for n in (5, 9, 2, 7, 3)], "labels": list(range(5))})

    def collate(rows: List[Dict[str, Any]]) -> Dict[str, Any]:
        return {"labels": [row["labels"] for row in rows], "worker": os.getpid()}

    loader = data.eval_loader(ds, collate, batch_size=2, world=World(), workers=data.Workers(2, keep=keep),
                              grouped=grouped)
    passes = [list(loader) for _ in range(3)]
    assert all([batch["labels"] for batch in each] == [batch["labels"] for batch in passes[0]] for each in passes)
    assert sorted(label for batch in passes[0] for label in batch["labels"]) == list(range(5))
    workers = [frozenset(batch["worker"] for batch in each) for each in passes]
    assert os.getpid() not in workers[0]
    assert len(set(workers)) == (1 if keep else 3)


@pytest.mark.parametrize(("device", "count", "pinned", "kept"), [
    ("cuda", 2, True, True), ("xla", 2, False, True), ("cpu", 2, False, False), ("cuda", 0, True, False)])
def test_eval_workers_are_kept_on_an_accelerator_and_not_on_the_cpu(device: str, count: int, pinned: bool,
                                                                    kept: bool) -> None:
    """On the CPU the model's weights are in the process's memory: a kept worker would keep, copy-on-write, a copy
    of each one the training changes after its fork (evalsets.from_splits asks by the run's device)."""
    assert data.Workers.on(device, count) == data.Workers(count, pin_memory=pinned, keep=kept)


def test_a_model_predicts_the_same_in_length_groups_as_in_the_splits_order(tmp_path: Path) -> None:
    """A real (random) RoBERTa with the fast paths, in fp32: label ids equal; the scores before the arg-max
    equal to float rounding (a batch's padding changes the shapes the matrix products run on)."""
    from nli.model import fastpaths
    from nli.model.build import build_model, train_bpe_tokenizer
    from nli.runtime.device import Compute

    cfg = build_config(["experiment=quickstart"])
    rng = random.Random(1)
    words = "the a man woman dog cat plays runs eats sees big small red green".split()
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 30))) for _ in range(70)]
    tokenizer = train_bpe_tokenizer(texts, vocab_size=300, max_seq_length=64)
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    model = build_model(cfg.model, cfg.task, tokenizer)
    fastpaths.install(model, device=torch.device("cpu"))
    ds = datasets.Dataset.from_dict({"labels": [i % 3 for i in range(70)], **tokenizer(texts, texts[::-1])})
    compute = Compute(torch.device("cpu"), torch.float32)
    collator = DataCollatorWithPadding(tokenizer)
    made = {}
    for grouped in (True, False):
        loader = data.eval_loader(ds, collator, batch_size=16, world=World(), grouped=grouped)
        made[grouped] = gather(predict(model, loader, cfg.task, compute), World())
    assert made[True].labels.tolist() == made[False].labels.tolist() == ds["labels"]
    assert made[True].values.tolist() == made[False].values.tolist()
    regression = dataclasses.replace(cfg.task, label_names=[], metrics=["pearson"],
                                     main_metric="pearson")  # predict() keeps the raw scores
    assert regression.is_regression
    scores = {grouped: predict(model, data.eval_loader(ds, collator, batch_size=16, world=World(), grouped=grouped),
                               regression, compute)
              for grouped in (True, False)}
    grouped_loader = data.eval_loader(ds, collator, batch_size=16, world=World())
    order = grouped_loader.batch_sampler.order  # type: ignore[union-attr]
    assert order != sorted(order)  # the model saw the examples by length, not in the split's order
    np.testing.assert_allclose(scores[True].values[:, 0], scores[False].values[:, 0], rtol=0, atol=1e-5)


def test_a_rank_whose_slice_of_a_split_is_empty_predicts_nothing_and_the_gather_is_the_split() -> None:
    """A split smaller than the ranks (data.max_eval_samples=1 under torchrun of two, a tiny eval.extra set): rank 0's
    slice is empty, and its prediction crashed (torch.cat of no batch) while the others waited in the gather."""
    from nli.model.build import build_model, train_bpe_tokenizer
    from nli.runtime.device import Compute

    cfg = build_config(["experiment=quickstart"])
    tokenizer = train_bpe_tokenizer(["a man plays", "a dog runs"], vocab_size=300, max_seq_length=16)
    model = build_model(cfg.model, cfg.task, tokenizer)
    collator, compute = DataCollatorWithPadding(tokenizer), Compute(torch.device("cpu"), torch.float32)
    regression = dataclasses.replace(cfg.task, label_names=[], metrics=["pearson"], main_metric="pearson")
    for task, label in ((cfg.task, 2), (regression, 2.5)):  # a class id; a score (nli.data.loaders encodes floats)
        ds = datasets.Dataset.from_dict({"labels": [label], **tokenizer(["a man plays"], ["a dog runs"])})
        parts = [predict(model, data.eval_loader(ds, collator, batch_size=16, world=World(rank, 2)), task, compute)
                 for rank in (0, 1)]
        assert [len(part.values) for part in parts] == [0, 1]
        whole = predict(model, data.eval_loader(ds, collator, batch_size=16, world=World()), task, compute)
        for name in ("values", "labels", "log_probs"):  # what gather joins, in rank order
            if getattr(whole, name) is None:
                assert all(getattr(part, name) is None for part in parts)
                continue
            joined = np.concatenate([getattr(part, name) for part in parts])
            assert joined.dtype == getattr(whole, name).dtype and joined.tolist() == getattr(whole, name).tolist()


# ------------------------------------------------------------------------------ whole runs


def stsb_varied(root: Path) -> Path:
    """STS-B in GLUE's layout with sentences of 2 to 20 words, so that length groups reorder them."""
    return stsb_dir(root, words=(2, 20), sizes=(96, 40, 30), seed=3)


def submitted(path: Path) -> Dict[str, float]:
    with open(path, newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"]
    return {row[0]: float(row[1]) for row in rows[1:]}


def random_stsb_model(folder: Path, glue: Path) -> Path:
    """A tiny RoBERTa regressor with random weights and its tokenizer, saved: its scores differ from one
    pair to the next (a few steps of training bring every score to the mean)."""
    from nli.model.build import build_model, train_bpe_tokenizer

    cfg = build_config(["task=stsb", "model=tiny", "data.max_seq_length=64"])
    rows = [line.split("\t") for line in (glue / "STS-B" / "train.tsv").read_text().splitlines()[1:]]
    tokenizer = train_bpe_tokenizer([text for row in rows for text in row[7:9]], vocab_size=300, max_seq_length=64)
    torch.manual_seed(0)
    model = build_model(cfg.model, cfg.task, tokenizer)
    head = model.classifier  # transformers' init (std 0.02) scores every pair alike to 3 decimals
    with torch.no_grad():
        head.dense.weight.normal_(0, head.dense.in_features ** -0.5)
        head.out_proj.weight.normal_(0, 1.0)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_grouped_evaluation_scores_and_submits_what_the_splits_order_does(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """A regression task (scores, not arg-maxes: where padding shows), evaluated with and without length
    groups, in fp32: the same metrics and submission file to float rounding, each row under its own index."""
    glue = stsb_varied(tmp_path / "glue_data")
    model = random_stsb_model(tmp_path / "model", glue)
    outs = {}
    for grouped in (True, False):
        with monkeypatch.context() as patched:
            if not grouped:
                patched.setattr(data, "eval_loader", functools.partial(data.eval_loader, grouped=False))
            outs[grouped] = tmp_path / f"eval-grouped-{grouped}"
            proc = run_app([*EVAL, "task=stsb", f"model.name_or_path={model}", f"data.dir={glue}",
                            "data.max_seq_length=64", "train.eval_batch_size=8", "hw=cpu", "precision=fp32",
                            "train.predict=true", f"hydra.run.dir={outs[grouped]}"], cwd=tmp_path)
            assert proc.returncode == 0, proc.stdout + proc.stderr
    grouped, ordered = read_results(outs[True]), read_results(outs[False])
    for key in ("pearson", "spearmanr", "combined_score", "objective"):  # scores apart by ~1e-6: correlations too
        assert grouped[key] == pytest.approx(ordered[key], abs=1e-5)
    files = [submitted(folder / "predictions" / "STS-B.tsv") for folder in (outs[True], outs[False])]
    assert list(files[0]) == [str(i) for i in range(30)] == list(files[1])
    # Written with 3 decimals: a last digit may round the other way.
    assert all(abs(files[0][key] - files[1][key]) <= 1.001e-3 for key in files[0])
    assert len(set(files[0].values())) > 10  # scores that tell the rows apart: a reordering would show


def test_a_regressions_scores_under_bf16_are_the_models_own_not_rounded_to_bf16(tmp_path: Path) -> None:
    """Under bf16 autocast a regressor's score was its head's bf16 output: 8 significant bits, steps of 1/64 between
    2 and 4 on STS-B's scale, written so to the predictions and the submission file (every test pair 2.875 for a
    model whose fp32 scores differ in the 4th decimal) and correlated so, tied pairs and all. A score is the model's
    output itself, not an argmax of it: it is computed in fp32, what the exported model gives under from_pretrained
    and pipeline, whatever the run's precision."""
    glue = stsb_varied(tmp_path / "glue_data")
    model = random_stsb_model(tmp_path / "model", glue)
    scores, results = {}, {}
    for precision in ("bf16", "fp32"):
        out = tmp_path / f"eval-{precision}"
        proc = run_app([*EVAL, "task=stsb", f"model.name_or_path={model}", f"data.dir={glue}", "data.max_seq_length=64",
                        "hw=cpu", f"precision={precision}", "train.predict=true", f"hydra.run.dir={out}"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"precision {precision}" in proc.stdout + proc.stderr  # the run computed in it, as asked
        rows = [json.loads(line) for line in (out / "eval_predictions" / "validation.jsonl").read_text().splitlines()]
        scores[precision], results[precision] = np.array([row["prediction"] for row in rows]), read_results(out)
        assert submitted(out / "predictions" / "STS-B.tsv") == pytest.approx(
            submitted(tmp_path / "eval-bf16" / "predictions" / "STS-B.tsv"), abs=1.001e-3)
    assert len(set(scores["fp32"])) > 30 and np.abs(scores["bf16"] - scores["fp32"]).max() < 1e-5
    for key in ("pearson", "spearmanr", "loss"):
        assert results["bf16"][key] == pytest.approx(results["fp32"][key], abs=1e-6)


def test_a_regressor_that_gives_every_pair_one_score_has_undefined_correlations_said_once(tmp_path: Path) -> None:
    """A head whose output weights are zero scores every pair with its bias: Pearson's and Spearman's correlations
    are NaN, and so the objective; the run's end says why in one warning, where SciPy warned at every evaluation."""
    glue = stsb_varied(tmp_path / "glue_data")
    model = random_stsb_model(tmp_path / "model", glue)
    flat = AutoModelForSequenceClassification.from_pretrained(model)
    with torch.no_grad():
        flat.classifier.out_proj.weight.zero_()
        flat.classifier.out_proj.bias.fill_(2.5)
    flat.save_pretrained(model)
    proc = run_app([*EVAL, "task=stsb", f"model.name_or_path={model}", f"data.dir={glue}", "data.max_seq_length=64",
                    "hw=cpu", "precision=fp32", f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(tmp_path / "eval")
    assert np.isnan(results["objective"]) and np.isnan(results["pearson"]) and np.isnan(results["spearmanr"])
    assert results["warnings"] == ["validation: the model predicts the score 2.5 for all 40 examples, so its "
                                   "correlations with the gold scores are undefined (NaN). Train longer or at "
                                   "another learning rate, or start from a pretrained model"]
    assert "ConstantInputWarning" not in proc.stdout + proc.stderr


@pytest.mark.parametrize("pairs", [8, 1])
def test_a_split_whose_gold_scores_are_one_has_undefined_correlations_said_once(tmp_path: Path, pairs: int) -> None:
    """Pairs all scored alike (or one pair: data.max_eval_samples=1, where SciPy raises) leave Pearson's and
    Spearman's r undefined whatever the model predicts: the run's end says so, where its objective was NaN without
    a word."""
    glue = stsb_with_one_gold_score(tmp_path / "glue_data")
    model = random_stsb_model(tmp_path / "model", glue)
    proc = run_app([*EVAL, "task=stsb", f"model.name_or_path={model}", f"data.dir={glue}", "data.max_seq_length=64",
                    f"data.max_eval_samples={pairs}", "hw=cpu", "precision=fp32", f"hydra.run.dir={tmp_path / 'eval'}"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    results = read_results(tmp_path / "eval")
    assert np.isnan(results["objective"]) and np.isnan(results["pearson"]) and np.isnan(results["spearmanr"])
    examples = "one example has" if pairs == 1 else "8 examples all have"
    assert results["warnings"] == [f"validation: its {examples} the gold score 3, so the correlations with it "
                                   "are undefined (NaN) whatever the model predicts: evaluate on pairs whose scores "
                                   "differ (data.max_eval_samples, the split's file)"]


def test_an_evaluation_only_run_uses_the_fast_paths(shared_run: ShareRun, tmp_path: Path) -> None:
    trained = shared_run("fast", FAST)
    proc = run_app([*EVAL, f"model.name_or_path={trained}", f"hydra.run.dir={tmp_path / 'eval'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "fast paths: first_token, cpu_dropout, unpadded\n" in proc.stdout  # no gradient buffer: nothing trains
    results = read_results(tmp_path / "eval")
    assert results["eval_examples_per_second"] > 0


def metric_rows(folder: Path) -> List[tuple]:
    """metrics.csv's (step, metric) of each row."""
    with open(folder / "metrics.csv", newline="") as stream:
        return [(row["step"], row["metric"]) for row in csv.DictReader(stream)]


def test_an_evaluation_only_run_stopped_before_its_results_logs_its_figures_once_again(
        shared_run: ShareRun, tmp_path: Path) -> None:
    """An attempt stopped after its figures were logged, before results.json (writing the test predictions), leaves
    them in metrics.csv; the same command again logged each a second time."""
    trained, out = shared_run("fast", FAST), tmp_path / "eval"
    command = [*EVAL, f"model.name_or_path={trained}", f"hydra.run.dir={out}"]
    assert run_app(command, cwd=tmp_path).returncode == 0
    once = metric_rows(out)
    assert ("0", "eval/accuracy") in once and len(set(once)) == len(once)
    (out / "results.json").unlink()  # as the stopped attempt left it
    proc = run_app(command, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert metric_rows(out) == once


def test_the_best_checkpoints_evaluation_is_the_runs_final_one(shared_run: ShareRun, tmp_path: Path) -> None:
    """Not evaluated again at the end; its figures are those of the exported model evaluated afresh."""
    trained = shared_run("fast", FAST)
    results = read_results(trained)
    log = (trained / "train.log").read_text()
    assert f"the best checkpoint (step {results['best_step']}) {REUSED}" in log
    assert results["eval_examples_per_second"] > 0 and results["train_examples_per_second"] > 0
    out = tmp_path / "eval"
    proc = run_app([*EVAL, f"model.name_or_path={trained}", f"hydra.run.dir={out}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    fresh = read_results(out)
    assert (fresh["objective"], fresh["accuracy"]) == (results["objective"], results["accuracy"])


def test_a_resumed_run_evaluates_a_best_an_earlier_attempt_evaluated(shared_run: ShareRun, tmp_path: Path) -> None:
    """Its best (step 3) comes from a checkpoint: the exported model is evaluated at the end, to the same
    figures the first attempt reported."""
    finished = shared_run("still", STILL)
    run_dir = copy_run(finished, tmp_path / "stalled")
    (run_dir / "results.json").unlink()
    proc = run_app([*STILL, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert REUSED not in proc.stdout and "final evaluation of the best checkpoint by accuracy (step 3 of" in proc.stdout
    again, first = read_results(run_dir), read_results(finished)
    assert (again["objective"], again["accuracy"], again["best_step"]) == \
        (first["objective"], first["accuracy"], first["best_step"])
