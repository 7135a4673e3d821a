"""The benchmark scripts run end to end on a few steps (correctness only: no timing is asserted), as
a user runs them: ``python -m benchmarks.X`` from the repository root. Each run starts several training
processes (a minute of CPU for the Trainer comparison): marked ``bench``, left out of the default run and
run by CI after it (``pytest -m bench``); their refusals of bad flags, which start no run, stay in it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import List

import pytest

from benchmarks.mnli_like import ARCHITECTURES
from benchmarks.vs_trainer import PEAK_FLOPS, flops_per_token, ours_tf32, peak_for
from tests.support.runs import ROOT

TINY = ["experiment=quickstart", "hw=cpu", "data.synthetic_train_size=128", "data.synthetic_eval_size=32",
        "model.scratch.dropout=0"]


def benchmark(name: str, args: List[str], *, timeout: float = 600) -> subprocess.CompletedProcess:
    """``python -m benchmarks.NAME ARGS`` from the repository root."""
    return subprocess.run([sys.executable, "-m", f"benchmarks.{name}", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.bench
@pytest.mark.process
def test_scaling_runs_one_and_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "scaling.json"
    proc = benchmark("scaling", ["--processes", "1", "2", "--steps", "3", "--repeats", "1", "--json", str(out),
                                 "--", *TINY])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [row["processes"] for row in rows] == [1, 2]
    assert rows[0]["speedup"] == 1 and rows[0]["efficiency"] == 1
    assert all(row["examples_per_second"] > 0 for row in rows)
    assert abs(rows[1]["efficiency"] - rows[1]["speedup"] / 2) <= 1e-3  # each rounded to 3 places
    assert rows[0]["objective"] == rows[1]["objective"]  # the same run, split over two processes
    assert "efficiency" in proc.stdout and f"written to {out}" in proc.stdout


@pytest.mark.bench
@pytest.mark.process
def test_vs_trainer_runs_ours_and_both_trainer_setups(tmp_path: Path) -> None:
    """MNLI-like synthetic data, a tiny random RoBERTa, three steps of each system for each of two seeds."""
    out = tmp_path / "table"
    proc = benchmark("vs_trainer", ["--synthetic", "--arch", "tiny", "--synthetic-size", "256", "--steps", "3",
                                    "--test", "--seed", "1", "2", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.with_suffix(".json").read_text())
    systems = report["systems"]
    assert list(systems) == ["ours", "hf-defaults", "hf-tuned"]
    for figures in systems.values():
        assert figures["examples_per_second"] > 0 and figures["peak_memory_bytes"] > 0
        # Real tokens only: MNLI-like pairs hold ~40 on average, far from the 128 the defaults pad to.
        assert 15 < figures["tokens_per_second"] / figures["examples_per_second"] < 80
        assert 0 <= figures["dev_accuracy"] <= 1 and 0 <= figures["test_accuracy"] <= 1
        assert "mfu" not in figures  # no GPU here
        assert figures["eval_examples_per_second"] > 0 and figures["wall_seconds"] > 0
        for key in ("dev_accuracy", "test_accuracy"):  # the mean over the seeds, and their spread
            by_seed = figures[f"{key}_by_seed"]
            assert list(by_seed) == ["1", "2"]
            assert figures[key] == pytest.approx(sum(by_seed.values()) / 2)
            assert figures[f"{key}_sd"] == pytest.approx(abs(by_seed["1"] - by_seed["2"]) / 2 ** 0.5)
    settings = report["settings"]
    assert settings["steps"] == 3 and settings["task"].startswith("MNLI-like") and settings["seeds"] == [1, 2]
    assert settings["tf32"].startswith("on for every system")  # the Trainer gets TF32 where ours has it
    assert proc.stdout.count(" seed 1 ") == 3 and proc.stdout.count(" seed 2 ") == 3
    table = out.with_suffix(".md").read_text()
    assert "| system | precision | examples/s | tokens/s | eval examples/s | peak memory (GiB) |" in table
    ratio = systems["ours"]["examples_per_second"] / systems["hf-defaults"]["examples_per_second"]
    assert f"ours: {ratio:.2f}x the examples/s of hf-defaults" in table
    gap = 100 * (systems["ours"]["test_accuracy"] - systems["hf-tuned"]["test_accuracy"])
    assert "test accuracy, ours minus the Trainer over 2 seeds: " in table and f"{gap:+.1f} ± " in table
    assert table.split("\n\n", 1)[1] in proc.stdout  # the same table, after the machine's line
    # Evaluation against training, whole runs against each other, the training floors: there, whatever their values.
    assert re.search(r"ours: evaluation at [\d.]+ examples/s, [\d.]+x training's [\d.]+ \(aim: at least 2.5x\)",
                     table)
    assert re.search(r"whole run, start to results: \d+ s for ours, \d+ s for hf-defaults \([\d.]+x\), "
                     r"\d+ s for hf-tuned \([\d.]+x\)", table)
    for name, floor in (("hf-defaults", "1.8"), ("hf-tuned", "1.3")):
        assert re.search(rf"training floor against {name}: [\d.]+x, floor {floor}x: (met|NOT met)", table)
    assert re.search(r"whole-run floor against hf-tuned: [\d.]+x as fast, floor 1.2x: (met|NOT met)", table)
    # Two turns (a seed each): ours against each Trainer set-up turn by turn, the two back to back.
    for name in ("hf-defaults", "hf-tuned"):
        pairs = systems[name]["paired"]
        assert len(pairs["training"]) == len(pairs["whole_run"]) == 2 and min(pairs["training"]) > 0
        line = f"turn by turn, ours against {name}: training " + ", ".join(f"{r:.2f}x" for r in pairs["training"])
        assert line + f" (median {(pairs['training'][0] + pairs['training'][1]) / 2:.2f}x); whole run " in table
    # The CPU's bf16 capability: its model, the flags that bear on it, and what precision=auto makes of them.
    assert re.search(r"flags [+-]avx512f [+-]avx512_bf16 [+-]amx_tile [+-]amx_bf16; .* kernels, .*; precision=auto: "
                     r"(bf16|fp32) \(", report["machine"])


@pytest.mark.bench
@pytest.mark.process
def test_vs_trainer_on_short_single_sentences_gives_the_trainer_the_precision_ours_computes(tmp_path: Path) -> None:
    """SST-2's shape from the repository's RTE text, its first 64 examples, MiniLM from the test extras; with
    --precision auto (the default) ours runs precision=auto and the Trainer what that picks on this machine."""
    import torch

    from nli.config.schema import Precision
    from nli.runtime.device import choose_precision, native_of

    out = tmp_path / "table"
    proc = benchmark("vs_trainer", ["--sst2-like", "--train-examples", "64", "--steps", "2", "--systems", "ours",
                                    "hf-tuned", "--out", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.with_suffix(".json").read_text())
    computes = choose_precision(Precision.auto, native_of(torch.device("cpu")))[0].value
    assert report["settings"]["precision"] == f"auto ({computes} here)"
    assert report["settings"]["task"] == "sst2" and report["settings"]["train_examples"] == 64
    assert {system: figures["precision"] for system, figures in report["systems"].items()} == \
        {"ours": computes, "hf-tuned": computes}
    for figures in report["systems"].values():  # one short sentence each: SST-2's lengths, not RTE's pairs
        assert 5 < figures["tokens_per_second"] / figures["examples_per_second"] < 30
    table = out.with_suffix(".md").read_text()
    assert f"| ours | {computes} | " in table and f"| hf-tuned | {computes} | " in table
    assert re.search(r"whole-run floor against hf-tuned: [\d.]+x as fast, floor 1.2x: (met|NOT met)", table)


@pytest.mark.process
@pytest.mark.parametrize("flags, error", [
    # A repeated seed would be averaged as one while the gap's standard error counted it twice.
    (["--seed", "1", "1"], "--seed 1 1: give each seed once (--rounds repeats runs)"),
    (["--rounds", "0"], "--rounds 0: give at least 1"),  # no runs: nothing to report
    (["--steps", "0"], "--steps 0: give at least 1"),
    (["--train-examples", "0"], "--train-examples 0: give at least 1"),
    (["--synthetic", "--sst2-like"], "--synthetic and --sst2-like: choose one"),
    (["--sst2-like", "--train-examples", "5000"], "SST-2/train.tsv holds 2628 examples; give at most 2628"),
])
def test_vs_trainer_refuses_bad_flags_before_running(tmp_path: Path, flags: list, error: str) -> None:
    proc = benchmark("vs_trainer", [*flags, "--out", str(tmp_path / "table")], timeout=120)
    assert proc.returncode == 2 and error in proc.stderr
    assert not list(tmp_path.iterdir())  # nothing ran, nothing written


def test_model_flops_per_token_count_the_weights_outside_the_embeddings(tmp_path: Path) -> None:
    """RoBERTa-large: 24 layers of 12.6M weights (4h^2 attention + 8h^2 feed-forward, h=1024, plus
    biases and LayerNorms) and a 1M classification head, 6 FLOPs each per token, plus attention's
    12 x layers x h x length; the embeddings are looked up, not multiplied."""
    from transformers import AutoConfig

    AutoConfig.for_model("roberta", num_labels=2, **ARCHITECTURES["roberta-large"]).save_pretrained(tmp_path)
    layer = 12 * 1024**2 + 9 * 1024 + 4 * 1024  # weights; biases (q, k, v, out, 4h up, down); two LayerNorms
    head = 1024**2 + 1024 + 2 * 1024 + 2  # dense h x h, then h x 2 labels
    assert flops_per_token(tmp_path, mean_tokens=40) == 6 * (24 * layer + head) + 12 * 24 * 1024 * 40


@pytest.mark.parametrize("device, precision, tf32, peak", [
    # torch.cuda.get_device_name()'s words for each card; dense peaks from the data sheets.
    ("NVIDIA H100 80GB HBM3", "bf16", True, 989e12),  # SXM
    ("NVIDIA H100 80GB HBM3", "fp16", True, 989e12),
    ("NVIDIA H100 80GB HBM3", "fp32", True, 494.5e12),  # TF32 tensor cores
    ("NVIDIA H100 80GB HBM3", "fp32", False, 67e12),  # plain fp32
    ("NVIDIA H100 PCIe", "bf16", True, 756e12),  # not the SXM part's figure
    ("NVIDIA H100 NVL", "bf16", True, 835e12),
    ("NVIDIA H200", "bf16", True, 989e12),
    ("NVIDIA A100-SXM4-40GB", "bf16", True, 312e12),
    ("NVIDIA A100-PCIE-40GB", "fp32", True, 156e12),
    ("NVIDIA A100-SXM4-80GB", "fp32", False, 19.5e12),
    ("Tesla V100-SXM2-16GB", "fp16", True, 125e12),
    ("Tesla V100-PCIE-16GB", "fp16", True, 112e12),
    ("Tesla V100S-PCIE-32GB", "fp16", True, 130e12),
    ("Tesla V100-SXM2-16GB", "bf16", True, None),  # no bf16 tensor cores: no MFU rather than a wrong one
    ("Tesla V100-SXM2-16GB", "fp32", True, 15.7e12),  # no TF32 either: tf32=true changes nothing there
    ("Tesla T4", "fp16", True, 65e12),
    ("Tesla T4", "fp32", True, 8.1e12),
    ("NVIDIA L4", "bf16", True, 121e12),
    ("NVIDIA L40S", "bf16", True, 362e12),  # not L4's
    ("NVIDIA B200", "fp16", True, 2250e12),
    ("NVIDIA GeForce RTX 4090", "bf16", True, None),  # not in the table: no MFU
])
def test_mfu_peak_is_the_devices_for_the_precision_trained_in(device: str, precision: str, tf32: bool,
                                                              peak: float | None) -> None:
    assert peak_for(device, precision, tf32=tf32) == peak


def test_every_peak_table_row_is_dense_throughout() -> None:
    """The data sheets print sparse figures (twice the dense ones) beside dense ones: a row mixing them
    would show as TF32 at the 16-bit rate instead of half of it."""
    for name, peaks in PEAK_FLOPS.items():
        fp16, fp32, tf32 = peaks["fp16"], peaks["fp32"], peaks["tf32"]
        assert fp16 and fp32 and fp16 > 3 * fp32, name  # tensor cores outrun plain fp32 everywhere
        assert tf32 is None or abs(tf32 / (fp16 / 2) - 1) < 0.03, name
        assert peaks["bf16"] in (None, fp16), name  # the same tensor-core rate wherever both exist


def test_tf32_is_on_for_both_systems_unless_an_override_turns_it_off() -> None:
    assert ours_tf32([]) and ours_tf32(["train.compile=true"])
    assert not ours_tf32(["precision.tf32=false"]) and not ours_tf32(["++precision.tf32=false"])


@pytest.mark.bench
@pytest.mark.process
def test_step_ablation_times_every_variant_on_real_pairs(tmp_path: Path) -> None:
    out = tmp_path / "ablation.json"
    proc = benchmark("step_ablation", ["--batch-size", "4", "--batches", "2", "--rounds", "1", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["settings"]["data_dir"] == str(ROOT / "tests" / "data" / "glue_data")  # in the repository
    rows = report["rows"]
    assert [row["variant"] for row in rows] == ["stock", "first-token", "cpu-dropout", "unpadded", "embed-grad",
                                                "all"]
    assert [row["paths"] for row in rows] == [[], ["first_token"], ["cpu_dropout"], ["unpadded"], ["embed_grad"],
                                              ["first_token", "cpu_dropout", "unpadded", "embed_grad"]]
    assert rows[0]["speedup"] == 1 and all(row["seconds_per_step"] > 0 for row in rows)
    assert "speed-up" in proc.stdout and f"written to {out}" in proc.stdout


@pytest.mark.bench
@pytest.mark.process
def test_company_runs_each_case_and_reports_shares_of_idle(tmp_path: Path) -> None:
    """Alone and beside a busy process, with the thread policy on; the figures come from each run's own files."""
    out = tmp_path / "company.json"
    proc = benchmark("company", ["--cases", "idle", "busy", "--policy", "on", "--steps", "4", "--json", str(out),
                                 "--", "data.synthetic_train_size=128", "data.synthetic_eval_size=32"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads(out.read_text())
    assert report["model"] == "quickstart" and report["steps"] == 4
    cases = report["runs"]["on"]
    assert [len(cases["idle"]), len(cases["busy"])] == [1, 1]
    for row in [*cases["idle"], *cases["busy"]]:
        assert row["examples_per_second"] > 0 and row["gflops"] > 0 and row["peak_rss_gib"] > 0
        assert 1 <= row["threads"] <= len(os.sched_getaffinity(0))  # as the run's own log line said
    header = "| policy | case | examples/s (each run) | share of idle | threads | GFLOP/s | peak RSS (GiB) |"
    assert header in proc.stdout
    assert "| on | idle | " in proc.stdout and " | 100% | " in proc.stdout and "| on | busy | " in proc.stdout


@pytest.mark.bench
@pytest.mark.process
def test_checkpointing_reports_speed_and_memory_off_and_on(tmp_path: Path) -> None:
    out = tmp_path / "checkpointing.json"
    proc = benchmark("checkpointing", ["--model", "quickstart", "--steps", "4", "--rounds", "1", "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())
    assert [len(runs["off"]), len(runs["on"])] == [1, 1]
    assert all(row["examples_per_second"] > 0 and row["peak_gib"] > 0 for row in [*runs["off"], *runs["on"]])
    assert "| off | " in proc.stdout and "(1.00x)" in proc.stdout and "| on | " in proc.stdout


@pytest.mark.bench
@pytest.mark.process
def test_recipes_compares_a_run_with_the_published_figure(tmp_path: Path) -> None:
    # The recipe's own settings, on the tiny model and the RTE files the project carries: no Hub.
    out = tmp_path / "recipes.json"
    proc = benchmark("recipes", ["--run", "electra-large-small-tasks", "--tasks", "rte",
                                 "--out", str(tmp_path / "runs"), "--json", str(out), "--", "model=tiny",
                                 "data.dir=tests/data/glue_data", "hw=cpu", "data.max_train_samples=64",
                                 "data.max_eval_samples=32", "train.max_steps=3"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [row] = json.loads(out.read_text())
    ours = row["results"]["accuracy"]
    assert row["published"] == {"accuracy": 88.0} and row["results"]["train_steps"] == 3
    config = (tmp_path / "runs" / "electra-large-small-tasks" / "rte" / "config.yaml").read_text()
    assert "layer_decay: 0.9" in config and "name: rte" in config  # the recipe's settings were what ran
    assert f"| electra-large-small-tasks | rte | accuracy | 88.0 | {100 * ours:.1f} | {100 * ours - 88:+.1f} |" \
        in proc.stdout


@pytest.mark.process
def test_recipes_lists_every_command_without_running_and_refuses_unknown_recipes() -> None:
    proc = benchmark("recipes", [])
    assert proc.returncode == 0, proc.stderr
    assert "| deberta-v3-large-mnli | mnli | accuracy | 91.8 | not run |" in proc.stdout
    assert "python train.py experiment=electra-large-small-tasks task=stsb hw=auto" in proc.stdout
    proc = benchmark("recipes", ["--run", "deberta-v4-mnli"])
    assert proc.returncode != 0 and "no published figures for ['deberta-v4-mnli']" in proc.stderr


@pytest.mark.bench
@pytest.mark.process
def test_analysis_cost_times_each_part_on_mnli_sized_dev_sets() -> None:
    proc = benchmark("analysis_cost", [])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "MNLI's two dev sets, 19,647 pairs:" in proc.stdout
    for part in ("probabilities and loss", "per-class figures", "confusion matrix", "predictions file", "all of it"):
        assert re.search(rf"^  {part} +\d+\.\d{{3}} s +\d+\.\d µs per example$", proc.stdout, re.M), proc.stdout


@pytest.mark.bench
@pytest.mark.process
def test_search_runs_the_four_searches_and_counts_each_ones_trials(tmp_path: Path) -> None:
    out = tmp_path / "search.json"
    proc = benchmark("search", ["--trials", "2", "--size", "128", "--eval-every", "4", "--launcher", "basic",
                                "--json", str(out)])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    runs = json.loads(out.read_text())
    assert list(runs) == ["batched", "asynchronous", "batched, median pruner", "asynchronous, median pruner"]
    for (run,) in runs.values():
        assert run["complete"] + run["pruned"] + run["failed"] == 2 and run["seconds"] > 0
    line = r"^\| asynchronous \| [\d.]+ \| [\d.]+x \| \d+ \| \d / \d / \d \| "
    assert re.search(line, proc.stdout, re.M), proc.stdout


@pytest.mark.process
def test_search_refuses_bad_flags_before_running() -> None:
    proc = benchmark("search", ["--trials", "0"], timeout=120)
    assert proc.returncode == 2 and "--trials must be at least 1" in proc.stderr
