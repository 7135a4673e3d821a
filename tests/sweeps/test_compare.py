"""`python -m nli.report compare RUN_A RUN_B` (nli/sweep/compare.py) on real runs' prediction files: a run
against itself, against a copy built to differ by known counts, McNemar's p against statsmodels' own on
the same table, and the runs it refuses."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Callable, Dict, List

import numpy as np
import pytest
import yaml
from omegaconf import OmegaConf
from sklearn.metrics import f1_score
from statsmodels.stats.contingency_tables import mcnemar as statsmodels_mcnemar

from nli.config.schema import task_config
from nli.contract import CLAIM_FILE, CONFIG_FILE, RESULTS_FILE
from nli.io.storage import Storage
from nli.sweep import compare, report
from nli.sweep.compare import Split
from nli.sweep.differences import verdict
from tests.support.runs import FAST, copy_run, read_results, run_app, shared_folder
from tests.sweeps.test_report import SWEEP, claim, run_sweep

PREDICTIONS = Path("eval_predictions", "validation.jsonl")


@pytest.fixture
def job(shared_root: Path) -> Path:
    """A real run's folder (job 0 of the report's shared sweep: the fast quickstart), read only."""
    return shared_folder(shared_root, "report-sweep", SWEEP, run_sweep) / "0"


def rewrite(run: Path, change: Callable[[int, Dict], None]) -> List[Dict]:
    """The run's validation predictions, each line changed in place by ``change(i, line)``; the new lines."""
    path = run / PREDICTIONS
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for i, line in enumerate(lines):
        change(i, line)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return lines


def test_a_run_against_a_copy_of_itself_is_not_told_apart(job: Path, tmp_path: Path) -> None:
    (found,) = compare.compare_runs(str(job), str(copy_run(job, tmp_path / "copy")))
    (accuracy,) = found.metrics
    assert found.split == "validation" and found.examples == 96
    assert accuracy.a == accuracy.b == pytest.approx(read_results(job)["accuracy"])  # the file is the run's
    assert (accuracy.difference.low, accuracy.difference.high) == (0.0, 0.0)
    assert verdict(accuracy.difference) == "not told apart"
    assert found.mcnemar is not None and (found.mcnemar.only_a, found.mcnemar.only_b) == (0, 0)
    assert found.mcnemar.p_value == 1.0 and found.mcnemar.both + found.mcnemar.neither == 96


def test_a_copy_built_to_differ_is_told_apart_and_mcnemar_is_statsmodels(job: Path, tmp_path: Path) -> None:
    """B: A's predictions with every third example answered right and every fifth (not third) answered
    wrong; the counts of the table follow from A's answers, and McNemar's p is statsmodels' on that table."""
    built = copy_run(job, tmp_path / "built")
    original = rewrite(built, lambda i, line: None)
    labels = [name[len("probability_"):] for name in original[0] if name.startswith("probability_")]

    def change(i: int, line: Dict) -> None:
        if i % 3 == 0:
            line["prediction"] = line["label"]
        elif i % 5 == 0:
            line["prediction"] = next(label for label in labels if label != line["label"])

    changed = rewrite(built, change)
    right_a = np.array([line["prediction"] == line["label"] for line in original])
    right_b = np.array([line["prediction"] == line["label"] for line in changed])
    table = [[int(np.sum(right_a & right_b)), int(np.sum(right_a & ~right_b))],
             [int(np.sum(~right_a & right_b)), int(np.sum(~right_a & ~right_b))]]
    assert table[0][1] > 0 and table[1][0] > table[0][1]  # both kinds of disagreement, B ahead

    (found,) = compare.compare_runs(str(job), str(built))
    assert found.mcnemar is not None
    assert [[found.mcnemar.both, found.mcnemar.only_a], [found.mcnemar.only_b, found.mcnemar.neither]] == table
    assert found.mcnemar.p_value == pytest.approx(statsmodels_mcnemar(table, exact=True).pvalue, rel=1e-9)
    (accuracy,) = found.metrics
    assert accuracy.difference.mean == pytest.approx(right_b.mean() - right_a.mean())
    assert 0 < accuracy.difference.low <= accuracy.difference.mean <= accuracy.difference.high
    assert verdict(accuracy.difference) == "told apart"


def test_the_printout_is_a_table_of_each_figure_with_what_it_is(job: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    perfect = copy_run(job, tmp_path / "perfect")
    rewrite(perfect, lambda i, line: line.update(prediction=line["label"]))
    assert report.main(["compare", str(job), str(perfect)]) == 0
    printed = capsys.readouterr().out
    accuracy = read_results(job)["accuracy"]
    wrong = round((1 - accuracy) * 96)
    assert (f"| validation | 96 | accuracy | {accuracy:.4f} | 1.0000 | {1 - accuracy:+.4f} | [+"
            in printed)  # the interval starts above 0
    assert f"| validation | {96 - wrong} | 0 | {wrong} | 0 | {2 * 0.5 ** wrong:.3g} |" in printed  # 2 x 0.5^n
    assert "percentile bootstrap over the examples" in printed and "McNemar p: exact two-sided" in printed



def test_a_split_given_twice_is_compared_once(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``--split validation --split validation`` printed the split's lines twice in each table."""
    copy = copy_run(job, tmp_path / "copy")
    assert report.main(["compare", str(job), str(copy), "--split", "validation", "--split", "validation"]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("| validation |")]
    assert len(lines) == 2 and lines[0].startswith("| validation | 96 | accuracy |"), printed  # one in each table


def test_runs_of_other_examples_are_refused_naming_the_split(job: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    fewer = copy_run(job, tmp_path / "fewer")
    path = fewer / PREDICTIONS
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:80]))
    # Scored on 80 examples under the same settings, as where the data changed under them (another Hub revision).
    results = read_results(fewer)
    results["per_class"]["validation"] = {"entailment": {"support": 80}}
    (fewer / RESULTS_FILE).write_text(json.dumps(results))
    assert report.main(["compare", str(job), str(fewer)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: validation: the runs predicted different examples (96 and 80 labelled")
    assert "with the same data.max_eval_samples" in said


def test_runs_of_other_data_settings_are_refused_naming_the_settings(job: Path, tmp_path: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Two quickstarts of other synthetic_eval_size were told to use the same data.max_eval_samples, which both
    had left alone."""
    other = tmp_path / "other"
    proc = run_app([*FAST, "data.synthetic_eval_size=64", f"hydra.run.dir={other}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert report.main(["compare", str(job), str(other)]) == 2
    said = capsys.readouterr().err
    assert said.startswith("error: validation: the runs predicted different examples (96 and 64 labelled")
    assert said.endswith(": the runs ran with data.synthetic_eval_size=96 and 64: compare runs evaluated with the "
                         "same\n") and "max_eval_samples" not in said, said


def test_a_damaged_predictions_file_is_refused_naming_its_line(job: Path, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    cut = copy_run(job, tmp_path / "cut")
    path = cut / PREDICTIONS
    first, second, *_ = path.read_text().splitlines(keepends=True)
    path.write_text(first + second[:40])  # a copy cut short in its second line
    assert report.main(["compare", str(job), str(cut)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"error: {path}, line 2: not a prediction's JSON object")
    assert f"eval.only=true model.name_or_path={cut} predicts again" in said


@pytest.mark.parametrize("kept", [0, 80], ids=["emptied", "cut-between-lines"])
def test_a_predictions_file_cut_short_between_lines_is_refused_as_such(kept: int, job: Path, tmp_path: Path,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """A copy stopped part-way (or emptied by a full disk) read as a run of other examples, and was sent to set
    data.max_eval_samples."""
    cut = copy_run(job, tmp_path / "cut")
    path = cut / PREDICTIONS
    path.write_text("".join(path.read_text().splitlines(keepends=True)[:kept]))
    assert report.main(["compare", str(job), str(cut)]) == 2
    said = capsys.readouterr().err
    assert said.startswith(f"error: {path}: {kept} labelled predictions, where the run scored 96 (results.json): the "
                           "file was cut short") and said.count("\n") == 1, said
    assert "max_eval_samples" not in said and f"eval.only=true model.name_or_path={cut} predicts again" in said


def test_a_run_without_predictions_is_refused_saying_how_to_make_them(job: Path, tmp_path: Path,
                                                                      capsys: pytest.CaptureFixture[str]) -> None:
    bare = copy_run(job, tmp_path / "bare")
    (bare / PREDICTIONS).unlink()
    assert report.main(["compare", str(job), str(bare)]) == 2
    said = capsys.readouterr().err
    assert f"{bare} has no eval_predictions/" in said and f"eval.only=true model.name_or_path={bare}" in said
    assert report.main(["compare", str(job), str(copy_run(job, tmp_path / "copy")), "--split", "test"]) == 2
    assert "--split test: not a split both runs predicted; they share validation" in capsys.readouterr().err


def test_a_sweep_directory_or_no_folder_is_said_alone_as_what_it_is(job: Path, tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep directory, or a mistyped path, was 'not a run folder (no config.yaml)', inside 'X and Y share no eval
    split's predictions' with the splits the other run predicted."""
    sweep_dir, nowhere = job.parent, tmp_path / "nowhere"
    assert report.main(["compare", str(sweep_dir), str(job)]) == 2
    assert capsys.readouterr().err == (f"error: {sweep_dir} is a sweep directory, not a run: give two of its jobs' "
                                       f"folders ({sweep_dir / '0'}, {sweep_dir / '1'}, ...)\n")
    assert report.main(["compare", str(job), str(nowhere)]) == 2
    assert capsys.readouterr().err == (f"error: {nowhere}: no such folder; give a run's output folder (the one "
                                       "holding config.yaml and eval_predictions/)\n")


def test_one_run_given_twice_is_refused_not_found_equal_to_itself(job: Path, capsys: pytest.CaptureFixture[str],
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """``compare runA runA/`` (a tab completed to the run given first) printed a table of no difference, 'not told
    apart', and ended with 0."""
    monkeypatch.chdir(job.parent)
    assert report.main(["compare", str(job), "0/"]) == 2
    assert capsys.readouterr().err == (f"error: RUN_B 0/ is RUN_A's folder again ({job.resolve()}): give the folders "
                                       "of two runs\n")


@pytest.mark.parametrize("state", ["running", "stopped"])
def test_a_run_not_ended_is_said_so_not_sent_to_predict_again(state: str, job: Path, tmp_path: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    """A run still training, or stopped (SIGTERM) before its end, has no predictions and no results.json yet: it was
    said to have run with eval.save_predictions=false, and sent to predict again with eval.only."""
    unended = copy_run(job, tmp_path / state)
    (unended / RESULTS_FILE).unlink()
    shutil.rmtree(unended / "eval_predictions")
    if state == "running":
        claim(unended, time.time(), file=CLAIM_FILE)
    assert report.main(["compare", str(job), str(unended)]) == 2
    said = capsys.readouterr().err
    assert said.count("\n") == 1 and "eval.only" not in said, said
    assert (f"a run is still going in {unended} (host " if state == "running" else
            f"{unended} has not ended (no results.json): it was stopped, or failed, before its final") in said


def test_an_extra_sets_split_is_scored_as_that_set() -> None:
    from nli.config.schema import task_config

    mnli = task_config("mnli")
    assert compare.task_of(mnli, "hans/validation").name == "hans"
    assert compare.task_of(mnli, "validation_matched") is mnli


def test_f1_is_resampled_over_the_same_examples_for_both_runs() -> None:
    """A metric that is not a mean (MRPC's F1): B right everywhere, A on three quarters; the observed difference
    is scikit-learn's, and the interval leaves 0 out."""
    rng = np.random.default_rng(0)
    labels = rng.integers(0, 2, 200)
    wrong = rng.random(200) < 0.25
    a = Split(np.arange(200), labels, np.where(wrong, 1 - labels, labels))
    b = Split(np.arange(200), labels, labels.copy())
    found = compare.metric_difference("f1", a, b, resamples=300)  # each resample two scikit-learn calls: fewer here
    assert found.difference.mean == pytest.approx(1.0 - f1_score(labels, a.predictions))
    assert 0 < found.difference.low < found.difference.mean <= found.difference.high
    same = compare.metric_difference("f1", a, a, resamples=300)
    assert (same.difference.low, same.difference.high) == (0.0, 0.0)


def test_a_run_in_a_bucket_is_read_there(job: Path, gcs_emulator: Dict[str, str], tmp_path: Path) -> None:
    """A Vertex AI job's folder in its bucket: its config and predictions read through gcsfs (the emulator)."""
    url = f"gs://test-bucket/{tmp_path.name}/run"
    bucket = Storage(url)
    bucket.write_bytes("config.yaml", (job / "config.yaml").read_bytes())
    bucket.upload_dir(job / "eval_predictions", "eval_predictions")
    (found,) = compare.compare_runs(str(job), url)
    assert found.split == "validation" and found.mcnemar is not None and found.mcnemar.only_a == 0
    assert (found.metrics[0].difference.low, found.metrics[0].difference.high) == (0.0, 0.0)


@pytest.mark.parametrize("flat", [False, True], ids=["some-resamples", "a-run"])
def test_a_correlation_undefined_on_some_resamples_or_a_run_has_no_interval_and_says_why(
        flat: bool, recwarn: pytest.WarningsRecorder) -> None:
    """Four STS-B pairs: a resample that draws one pair four times has no Pearson's r (NaN), so the percentile
    interval is NaN; the verdict said 'one seed: no interval' (compare has no seeds), after a SciPy warning per
    batch of resamples. So where a run predicts one score (its r is NaN)."""
    labels = np.array([0.5, 1.5, 3.0, 4.5])
    a = Split(np.arange(4), labels, np.array([2.5, 2.5, 2.5, 2.5]) if flat else np.array([0.7, 1.0, 3.2, 4.0]))
    b = Split(np.arange(4), labels, np.array([0.4, 1.9, 2.6, 4.4]))
    found = compare.metric_difference("pearson", a, b, resamples=300)
    assert np.isnan(found.difference.low) and np.isnan(found.difference.high)
    where = "for a run" if flat else "on some resamples of the examples"
    assert verdict(found.difference) == f"no interval: pearson is undefined (NaN) {where}"
    (line,), _ = compare.tables([compare.Comparison("validation", 4, [found], None)])
    assert line[6] == "" and line[7] == verdict(found.difference)
    assert not [w for w in recwarn if "Degenerate" in type(w.message).__name__]


@pytest.mark.parametrize("text, said", [
    ("", "holds no task: not the config a run writes (emptied or replaced since); restore it, or compare another run"),
    ("task: [rte\n", "is not valid YAML (line 2): changed since the run wrote it; restore it, or compare another run"),
])
def test_a_config_that_is_damaged_is_said_so_with_the_fix(text: str, said: str, job: Path, tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """An emptied config.yaml was '(TypeError("'NoneType' object is not subscriptable"))', YAML's own error
    the same way: Python's words, and no fix."""
    copy = copy_run(job, tmp_path / "copy")
    (copy / CONFIG_FILE).write_text(text)
    assert report.main(["compare", str(job), str(copy)]) == 2
    assert capsys.readouterr().err == f"error: {copy / CONFIG_FILE} {said}\n"


def test_runs_of_two_tasks_are_refused_with_what_to_compare(job: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    copy = copy_run(job, tmp_path / "copy")
    config = yaml.safe_load((copy / CONFIG_FILE).read_text())
    config["task"] = OmegaConf.to_container(OmegaConf.structured(task_config("rte")))
    (copy / CONFIG_FILE).write_text(yaml.safe_dump(config))
    assert report.main(["compare", str(job), str(copy)]) == 2
    assert capsys.readouterr().err.endswith("validation: RUN_A's predictions are of task synthetic and RUN_B's of "
                                            "rte: compare two runs of one task, or --split a split both predicted of "
                                            "one (an eval.extra set's, such as hans/validation)\n")

