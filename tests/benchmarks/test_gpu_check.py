"""The GPU check (benchmarks/gpu_check/): its kit, its report, and its CPU rehearsal.

The rehearsal runs the check's CPU lines (the quickstart, an evaluation-only run with and without the
fast paths, SIGTERM and resume, torchrun with one process, an fp16-stored checkpoint, gradient
checkpointing) with ``--device cpu``, as the offline GPU machines run it: from the repository root, in
an environment with their library versions (transformers 5.17, huggingface_hub 1.33, ...:
requirements/gpu-machine.txt) and without Hydra or datasets until the check installs its kit with pip
--target. So it proves that the
kit is complete and that the project runs on those versions, before a GPU is there.

    bash .ci/gpu-check-env && python -m pytest -m gpu_rehearsal tests/benchmarks/test_gpu_check.py

The environment is made with Python 3.12, the GPU machines' own, where one is found (.ci/gpu-check-env), so
the kit rehearsed is the one they get. Measured on 2 cores: building it took 2 minutes on an Intel Xeon
with Python 3.12 (5.4 GB: PyPI's torch for 3.12 is CUDA's build, which runs on a CPU too), 3 minutes on an
AMD EPYC with 3.11 and torch's CPU build (1.6 GB); the rehearsal then about 4 minutes on either. Too long
for ``-m bench``: CI runs it as a phase of its own (.ci/run), the environment built once and kept.
NLI_GPU_CHECK_PYTHON names the Python of another such environment.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from safetensors.torch import save_file

from benchmarks.gpu_check import environment, kit, probes, report, runner, speed, subruns, training
from tests.support.runs import ROOT, environment_python, process_env


def test_the_kit_pins_every_package_by_version_and_names_its_wheels() -> None:
    pins = kit.pins()
    names = [pin.split("==")[0] for pin in pins]
    assert all("==" in pin for pin in pins)
    # What train.py imports that the GPU machines lack (their list: requirements/gpu-check.txt's header).
    assert {"hydra-core", "omegaconf", "antlr4-python3-runtime", "datasets", "dill", "multiprocess"} == set(names)
    assert kit.wheel_name("antlr4-python3-runtime==4.9.3") == "antlr4_python3_runtime-4.9.3"
    assert kit.wheel_name("hydra-core==1.3.8") == "hydra_core-1.3.8"


def test_the_kit_pins_what_hydra_and_omegaconf_ask_for() -> None:
    """Installed without dependencies, the kit must pin what its own packages require."""
    from importlib.metadata import requires

    pins = dict(pin.split("==") for pin in kit.pins())
    assert pins["antlr4-python3-runtime"].startswith("4.9.")  # hydra-core and omegaconf: ==4.9.*
    assert any("antlr4-python3-runtime==4.9" in r for r in requires("omegaconf") or [])


def test_a_preset_cell_says_what_was_measured_or_why_not() -> None:
    row = {"hw": "v100", "recipe": "roberta-large-mnli", "micro_batch": 16, "length": 128, "dtype": "fp16",
           "card_memory": 16 * 2**30}
    assert speed.preset_cell({**row, "need": 9.25 * 2**30}) == "v100 roberta-large-mnli 16x128 fp16: 9.2 of 16 GiB"
    assert speed.preset_cell({**row, "skipped": "not measured: out of the line's time"}) \
        == "v100 roberta-large-mnli 16x128 fp16: not measured: out of the line's time"


def test_stored_dtypes_reads_the_safetensors_header(tmp_path: Path) -> None:
    import torch

    save_file({"a": torch.zeros(2, dtype=torch.float16), "b": torch.zeros(2), "c": torch.zeros(2, dtype=torch.long)},
              tmp_path / "m.safetensors")
    assert probes.stored_dtypes(tmp_path / "m.safetensors") == ["float16", "float32"]  # integers are not weights


def test_a_report_says_what_ran_where_and_skips_are_not_passes(tmp_path: Path) -> None:
    lines = [subruns.Line("oom", "e. oom", status="skipped: no GPU"),
             subruns.Line("resume", "d. resume", status="fail", detail="exit 1; last line: boom",
                            logs=["logs.txt: resume-stopped"])]
    report.write_report(tmp_path, {"device": "CPU", "ran_on": "cpu", "environment": {"torch": "2.13.0"}}, lines, 3)
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [line["status"] for line in written["lines"]] == ["skipped: no GPU", "fail"]
    md = (tmp_path / "gpu_check.md").read_text()
    assert "a CPU rehearsal: no GPU figures" in md and "| e. oom | skipped: no GPU |" in md
    assert "| d. resume | fail: exit 1; last line: boom |" in md and "in logs.txt: resume-stopped" in md


@pytest.mark.process
def test_asking_for_cuda_without_a_gpu_is_refused_in_a_report(tmp_path: Path) -> None:
    """On a GPU machine whose GPU torch cannot use, the report is what comes back: it must say so, and why."""
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "run", "--out", str(out),
                           "--device", "cuda", "--kit", str(tmp_path / "no-kit"), "--only", "torchrun"],
                          cwd=ROOT, capture_output=True, text=True, env=process_env(), timeout=300)
    assert proc.returncode == 1 and "--device cuda: no CUDA GPU here" in proc.stderr
    written = json.loads((out / "gpu_check.json").read_text())
    status = {line["name"]: line["status"] for line in written["lines"]}
    assert status == {"gpus": status["gpus"], "torchrun": "skipped: no CUDA GPU (--device cuda)"}
    assert "**No line ran**: --device cuda: no CUDA GPU here" in (out / "gpu_check.md").read_text()


@pytest.fixture(scope="session")
def machine_python() -> str:
    return environment_python("NLI_GPU_CHECK_PYTHON", ROOT / ".venv-gpu-check" / "bin" / "python",
                              what="GPU-machine environment", build="bash .ci/gpu-check-env")


CPU_LINES = ["quickstart_bf16", "quickstart_fp16", "eval_only", "resume", "torchrun", "fp16_checkpoint",
             "checkpointing"]


@pytest.mark.gpu_rehearsal
@pytest.mark.process
def test_the_check_rehearsed_on_the_cpu_with_the_gpu_machines_libraries(machine_python: str, tmp_path: Path) -> None:
    version = subprocess.run([machine_python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    kit_dir = tmp_path / "kit"
    subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "prepare", "--python-version", version,
                    "--kit", str(kit_dir)], cwd=ROOT, check=True, capture_output=True, timeout=600)
    env = {key: value for key, value in process_env().items() if key != "PYTHONPATH"}
    out = tmp_path / "report"
    proc = subprocess.run([machine_python, "-m", "benchmarks.gpu_check", "run", "--out", str(out), "--device", "cpu",
                           "--kit", str(kit_dir), "--budget", "900"], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=1200)
    written = json.loads((out / "gpu_check.json").read_text())
    status = {line["name"]: line["status"] for line in written["lines"]}
    assert proc.returncode == 0, (status, proc.stdout, proc.stderr)
    assert written["ran_on"] == "cpu" and written["environment"]["transformers"] == "5.17.0"
    assert "step aside" in written["environment"]["fast_paths"]  # written against 5.23: not installed on 5.17
    fp16 = "skipped: no GPU (fp16 autocast needs CUDA)"
    expected = {**{name: "pass" for name in CPU_LINES}, "quickstart_fp16": fp16}
    assert {name: status[name] for name in CPU_LINES} == expected
    assert all(status[name] == "skipped: no GPU" for name in status if name not in {*CPU_LINES, "syncs", "gpus"})
    assert status["gpus"].startswith("skipped: no GPU (")  # nvidia-smi absent, or listing none
    assert status["syncs"].startswith("skipped: no GPU (counted and read back")  # its plumbing ran
    lines = {line["name"]: line for line in written["lines"]}
    assert lines["resume"]["figures"]["relative_weight_gap"] == 0  # on the CPU, with its threads fixed: bit for bit
    assert lines["fp16_checkpoint"]["figures"]["bf16"]["exported_dtypes"] == ["float32"]
    assert "a CPU rehearsal: no GPU figures" in (out / "gpu_check.md").read_text()


def test_the_quickstart_lines_sum_the_loss_scalers_skips_from_the_runs_metrics(tmp_path: Path) -> None:
    """Line a gives the steps the loss scaler skipped in all and its last scale, read from metrics.csv as the
    run's CSV logger writes it (each log's count since the last); a CPU run, which logs neither, gives neither."""
    from nli.tracking.loggers import CsvTracker, RunInfo

    tracker = CsvTracker(run=RunInfo(name="run", group=None, config={}, log_dir=tmp_path, resume_id=None),
                         file="metrics.csv")
    for step, skipped, scale in ((20, 3, 8192.0), (40, 1, 4096.0), (60, 0, 4096.0)):
        tracker.log({"train/loss": 0.5, "train/skipped_steps": skipped, "train/loss_scale": scale}, step=step)
    assert training.scaler_figures(tmp_path) == {"skipped_steps": 4, "loss_scale": 4096.0}
    (tmp_path / "cpu").mkdir()
    CsvTracker(run=RunInfo(name="run", group=None, config={}, log_dir=tmp_path / "cpu", resume_id=None),
               file="metrics.csv").log({"train/loss": 0.5}, step=20)
    assert training.scaler_figures(tmp_path / "cpu") == {} and training.scaler_figures(None) == {}


@pytest.mark.bench
def test_the_speed_lines_read_each_systems_figures_from_the_benchmark(tmp_path: Path) -> None:
    """What lines g, n and o run on a GPU, run here on a tiny model: the benchmark's JSON read back per system,
    train.py's overrides passed after its flags (argparse takes the last --arch and --precision)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "work").mkdir()
    check = subruns.Check(tmp_path / "out", tmp_path / "work", "cpu", process_env(), deadline=time.monotonic() + 600)
    line = subruns.Line("workers", "o. a test")
    figures = speed.vs_trainer(check, line, "workers_0", ["--arch", "tiny", "--precision", "fp32", "--steps", "4",
                                                              "--synthetic-size", "256", "--systems", "ours", "--",
                                                              "data.num_workers=0"], timeout=300)
    assert list(figures) == ["ours"] and figures["ours"]["examples_per_second"] > 0
    assert figures["ours"]["eval_examples_per_second"] > 0 and figures["ours"]["mfu"] is None  # no GPU, no peak
    written = json.loads((tmp_path / "out" / "benchmarks.json").read_text())["workers_0"]
    assert written["settings"]["ours_overrides"] == ["data.num_workers=0"] and not line.logs
    assert "## workers_0" in (tmp_path / "out" / "benchmarks.md").read_text()
    assert {path.name for path in (tmp_path / "out").iterdir()} == {"benchmarks.json", "benchmarks.md"}


# Two functions compiled by dynamo, one past a recompile limit of 2: what line b reads, as this torch logs it.
RECOMPILING = """
import torch
torch._dynamo.config.recompile_limit = 2
torch._dynamo.config.automatic_dynamic_shapes = False
g = torch.compile(lambda x: x - 1, backend="eager")
f = torch.compile(lambda x: x * 2 + 1, backend="eager")
g(torch.ones(3))
for n in range(1, 6):
    f(torch.ones(n))
"""


@pytest.fixture(scope="module")
def dynamo_log() -> str:
    env = {**process_env(), "TORCH_LOGS": training.RECOMPILE_LOGS}
    proc = subprocess.run([sys.executable, "-c", RECOMPILING], capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def fake_training(monkeypatch: pytest.MonkeyPatch, output: str) -> None:
    results = {"loss": 0.3, "accuracy": 0.9, "train_examples_per_second": 100.0, "peak_memory_bytes": 2**30}
    monkeypatch.setattr(training, "train", lambda *args, **kwargs: subruns.Proc(0, output, results, None))


def test_the_compile_line_reads_dynamo_s_own_record_of_recompilations(
        dynamo_log: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """dynamo logs each line of a record behind its prefix, and words a limit it hits "hit config.recompile_limit
    (N)": the line fails on it, whatever the count."""
    fake_training(monkeypatch, dynamo_log)
    check = subruns.Check(tmp_path, tmp_path, "cuda", {}, deadline=time.monotonic() + 60)
    line = subruns.Line("compile", "b. compile")
    runner.run_line(check, line, training.line_compile, lambda: None)
    assert line.status == "fail" and "recompile_limit (2)" in line.detail, (line.status, line.detail)
    figures = line.figures
    assert figures["compilations"] == 3 and figures["recompiles"] == 2  # g once; f, then twice more (the 2nd hit it)
    assert figures["most_recompiles_of_one_function"] == 2 and figures["limits_hit"] == ["recompile_limit (2)"]
    assert figures["first_guard_failures"][0].startswith("1/0: tensor 'x' size mismatch")


def test_a_compile_line_with_no_compilation_logged_has_no_count(monkeypatch: pytest.MonkeyPatch,
                                                                tmp_path: Path) -> None:
    """No compilation in the log (TORCH_LOGS not honoured, or nothing compiled): not "0 recompilations, pass"."""
    fake_training(monkeypatch, "step 1: loss 0.3\n")
    check = subruns.Check(tmp_path, tmp_path, "cuda", {}, deadline=time.monotonic() + 60)
    line = subruns.Line("compile", "b. compile")
    runner.run_line(check, line, training.line_compile, lambda: None)
    assert line.status == "fail" and "dynamo logged no compilation" in line.detail


# A sub-run that ignores SIGTERM and has started a worker in a session of its own that ignores it too, as torchrun
# starts its workers; each writes its process id into the folder it is given, then sleeps.
STUBBORN = """
import os, signal, subprocess, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
folder = sys.argv[1]
if sys.argv[2:] == ["launcher"]:
    subprocess.Popen([sys.executable, __file__, folder, "worker"], start_new_session=True)
open(os.path.join(folder, sys.argv[2]), "w").write(str(os.getpid()))
print("started", flush=True)
time.sleep(600)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def stubborn(tmp_path: Path) -> list:
    script = tmp_path / "stubborn.py"
    script.write_text(STUBBORN)
    return [sys.executable, str(script), str(tmp_path), "launcher"]


def running(command: list, timeout: float) -> runner.LineFunction:
    """A line that runs ``command`` as a sub-run."""
    def function(check: subruns.Check, line: subruns.Line) -> None:
        subruns.sub_run(check, line, "run", command, timeout=timeout)
    return function


def wait_for(path: Path) -> int:
    for _ in range(200):
        if path.exists() and path.read_text():
            return int(path.read_text())
        time.sleep(0.05)
    raise AssertionError(f"{path} never written")


@pytest.mark.process
def test_a_sub_run_that_ignores_sigterm_is_stopped_whole_at_its_limit(tmp_path: Path) -> None:
    """Its own time limit: SIGTERM, then SIGKILL to it and its worker in another session; the line fails, saying so."""
    check = subruns.Check(tmp_path / "out", tmp_path, "cpu", process_env(), deadline=time.monotonic() + 300)
    line = subruns.Line("torchrun", "f. a test")
    start = time.monotonic()
    runner.run_line(check, line, running(stubborn(tmp_path), 3), lambda: None)
    seconds = time.monotonic() - start
    launcher, worker = wait_for(tmp_path / "launcher"), wait_for(tmp_path / "worker")
    assert line.status == "fail" and "timed out" in line.detail and "own limit of 3 s" in line.detail, line.detail
    assert seconds < 3 + subruns.KILL_GRACE + 5, seconds
    assert not alive(launcher) and not alive(worker) and not check.running


@pytest.mark.process
def test_a_snippet_that_ignores_sigterm_ends_at_the_check_s_deadline(tmp_path: Path) -> None:
    """A snippet (child) stopped at the check's deadline, not at its own 120 s: out of time, not a failure."""
    check = subruns.Check(tmp_path / "out", tmp_path, "cpu", process_env(), deadline=time.monotonic() + 13)
    line = subruns.Line("rng", "m. a test")
    start = time.monotonic()
    code = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"
    runner.run_line(check, line, lambda check, line: print(subruns.child(check, code)), lambda: None)
    assert time.monotonic() - start < 13 + subruns.KILL_GRACE + 5
    assert line.status == subruns.OUT_OF_TIME and "--budget ended" in line.detail, (line.status, line.detail)


@pytest.mark.process
def test_a_line_cut_by_the_budget_is_out_of_time_and_one_killed_by_a_signal_says_which(tmp_path: Path) -> None:
    check = subruns.Check(tmp_path / "out", tmp_path, "cpu", process_env(), deadline=time.monotonic() + 12)
    cut = subruns.Line("workers", "o. cut")
    runner.run_line(check, cut, running(stubborn(tmp_path), 300), lambda: None)
    assert cut.status == "skipped: out of time" and "the check's --budget ended" in cut.detail, cut.detail
    killed = subruns.Line("oom", "e. killed")
    check.deadline = time.monotonic() + 300
    suicide = [sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"]
    runner.run_line(check, killed, running(suicide, 60), lambda: None)
    assert killed.status == "fail" and "killed by SIGKILL (signal 9)" in killed.detail, killed.detail
    assert "timed out" not in killed.detail
    late = subruns.Line("mfu", "n. late")
    check.deadline = time.monotonic() + 5
    runner.run_line(check, late, running(suicide, 60), lambda: None)
    assert late.status == "skipped: out of time" and "not started" in late.detail
    header = {"device": "CPU", "ran_on": "cpu", "environment": {}}
    report.write_report(tmp_path / "out", header, [cut, killed, late], 9)
    md = (tmp_path / "out" / "gpu_check.md").read_text()
    assert "| o. cut | skipped: out of time: run: the check's --budget ended" in md


def test_the_report_s_folder_holds_a_handful_of_files_whatever_fails(tmp_path: Path) -> None:
    """A device run brings back a few files from a folder of its own: failed sub-runs' output and the speed lines'
    benchmark output go into one file each, beside the report, never one file per sub-run."""
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    check = subruns.Check(out, work, "cpu", process_env(), deadline=time.monotonic() + 300)
    lines = [subruns.Line(name, name) for name in ("resume", "torchrun", "checkpointing")]
    for line in lines:
        fails = [sys.executable, "-c", f"print('{line.name} went wrong'); raise SystemExit(3)"]
        runner.run_line(check, line, running(fails, 60), lambda: None)
        assert line.status == "fail" and line.logs == [f"logs.txt: {line.name}-run"]
    for label in ("vs_trainer", "workers_0"):
        speed.keep_benchmark(check, label, {"systems": {}, "label": label}, f"| {label} |\n")
    report.write_report(out, {"device": "CPU", "ran_on": "cpu", "environment": {}}, lines, 1)
    assert sorted(path.name for path in out.iterdir()) == sorted(report.REPORT_FILES)
    assert all(f"===== {line.name}-run =====\n{line.name} went wrong" in (out / "logs.txt").read_text()
               for line in lines)
    assert list(json.loads((out / "benchmarks.json").read_text())) == ["vs_trainer", "workers_0"]


def test_the_report_gives_the_gpus_torch_and_nvml_see_and_fails_where_torch_sees_none(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML (nvidia-smi) lists GPUs whatever CUDA can use: a driver older than torch's CUDA leaves torch with none,
    and every GPU line would read 'skipped: no GPU' on a GPU machine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho '0, NVIDIA H200, 143771 MiB, 580.0'\n"
                                        "echo '1, NVIDIA H200, 143771 MiB, 580.0'\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    check = subruns.Check(tmp_path, tmp_path, "cpu", {**process_env(), "PATH": os.environ["PATH"]},
                            deadline=time.monotonic() + 120)
    nvml = environment.nvidia_smi(check)
    assert nvml["gpus_nvml"] == 2 and nvml["nvml"][1] == "1, NVIDIA H200, 143771 MiB, 580.0"
    broken = {"gpus_torch": 0, "cuda_error": "RuntimeError: The NVIDIA driver on your system is too old"}
    line = environment.gpus_line(broken, nvml)
    assert line.status == "fail" and "nvidia-smi lists 2 GPU(s) and torch sees none" in line.detail
    assert "driver on your system is too old" in line.detail
    one = environment.gpus_line({"gpus_torch": 1}, nvml)
    assert one.status == "pass" and "they differ" in one.detail and one.figures["torch"] == 1
    assert environment.gpus_line({"gpus_torch": 0}, {"gpus_nvml": None, "nvml": "nvidia-smi: not found"}).status \
        == "skipped: no GPU (nvidia-smi: not found)"
    report.write_report(tmp_path, {"device": "NVIDIA H200", "ran_on": "cuda",
                                      "environment": {"gpus_torch": 1, **nvml}}, [one], 1)
    assert "**They differ:** GPUs: torch sees 1; nvidia-smi (NVML) lists 2" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.parametrize("jobs, passes", [(1, True), (4, True), (4, False)])
def test_a_line_that_reads_another_s_output_starts_after_it_whatever_the_order_and_the_jobs(
        jobs: int, passes: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """eval_only evaluates the bf16 quickstart's folder: --only eval_only brings that line in, and with one job or
    four, listed first or not, eval_only starts once it has ended; where it did not pass, eval_only is skipped."""
    assert [entry[0] for entry in runner.choose(runner.plan(), ["eval_only"])] == ["quickstart_bf16", "eval_only"]
    events: list = []

    def quickstart(check: subruns.Check, line: subruns.Line) -> None:
        events.append("quickstart starts")
        time.sleep(1)
        events.append("quickstart ends")
        subruns.require(passes, "no")

    def evaluation(check: subruns.Check, line: subruns.Line) -> None:
        events.append("eval_only starts")
        training.line_eval_only(check, line)

    def evaluated(*args: object, **kwargs: object) -> None:  # the evaluation itself is not under test
        raise subruns.Failed("evaluated")

    monkeypatch.setattr(training, "train", evaluated)
    entries = [("eval_only", "c", evaluation, "together"), ("quickstart_bf16", "a", quickstart, "together")]
    check = subruns.Check(tmp_path, tmp_path, "cpu", {}, deadline=time.monotonic() + 300)
    check.lines = {name: subruns.Line(name, title) for name, title, *_ in entries}
    worker = threading.Thread(target=runner.run_lines, args=(check, entries, jobs, lambda: None), daemon=True)
    worker.start()
    worker.join(30)
    assert not worker.is_alive(), "the lines never ended"
    assert events.index("eval_only starts") > events.index("quickstart ends"), events
    status = check.lines["eval_only"].status, check.lines["eval_only"].detail
    skipped = "skipped: it evaluates the bf16 quickstart's run folder, and that line ended 'fail'"
    assert status == (("fail", "evaluated") if passes else (skipped, "")), status


def test_the_default_budget_leaves_a_device_call_its_margin_and_the_report_names_lines_cut_for_time(
        tmp_path: Path) -> None:
    """A device call of about 590 s: the budget (the kit's install in it), the stop of what runs at its end and the
    watchdog after it must end well inside; and the Markdown says which lines the budget cut or never started."""
    assert runner.BUDGET + subruns.KILL_GRACE + runner.WATCHDOG <= 500
    help_text = subprocess.run([sys.executable, "-m", "benchmarks.gpu_check", "run", "--help"], cwd=ROOT,
                               capture_output=True, text=True, timeout=60).stdout
    assert "default 450" in " ".join(help_text.split())
    lines = [subruns.Line("quickstart_bf16", "a. quickstart", status="pass"),
             subruns.Line("workers", "o. workers", status=subruns.OUT_OF_TIME, detail="workers_0: the check's "
                            "--budget ended 40 s into it; stopped"),
             subruns.Line("presets", "h. presets", status=subruns.OUT_OF_TIME, detail="not started")]
    report.write_report(tmp_path, {"device": "H200", "ran_on": "cuda", "environment": {}, "budget_seconds": 450},
                           lines, 460)
    md = (tmp_path / "gpu_check.md").read_text()
    assert "**Skipped for time** (--budget 450 s), cut or never started: o. workers; h. presets." in md
    assert "| o. workers | skipped: out of time: workers_0: the check's --budget ended 40 s into it; stopped |" in md


def test_a_kit_pip_cannot_install_is_unpacked_and_one_that_fails_is_reported_not_fatal(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A Python without pip (a virtual environment made without it) still gets the kit: its wheels are pure Python."""
    import zipfile

    wheels = tmp_path / "kit" / "wheels"
    wheels.mkdir(parents=True)
    with zipfile.ZipFile(wheels / "gpukitprobe-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("gpukitprobe/__init__.py", "ANSWER = 42\n")
        wheel.writestr("gpukitprobe-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: gpukitprobe\nVersion: 1.0\n")
        wheel.writestr("gpukitprobe-1.0.data/purelib/gpukitprobe_extra.py", "EXTRA = 1\n")
        wheel.writestr("gpukitprobe-1.0.data/scripts/gpukitprobe", "#!/bin/sh\n")
    no_pip = subprocess.CompletedProcess([], 1, "", "/usr/bin/python3: No module named pip\n")
    monkeypatch.setattr(kit.subprocess, "run", lambda *args, **kwargs: no_pip)
    site, how = kit.install(tmp_path / "kit")
    assert site is not None and "unpacked" in how and "No module named pip" in how
    assert (site / "gpukitprobe" / "__init__.py").read_text() == "ANSWER = 42\n"
    assert (site / "gpukitprobe_extra.py").exists() and (site / "gpukitprobe-1.0.dist-info" / "METADATA").exists()
    assert not (site / "gpukitprobe").joinpath("..", "gpukitprobe-1.0.data").resolve().exists()
    (wheels / "multiprocess-0.70.19-py39-none-any.whl").write_bytes(b"")
    with pytest.raises(kit.KitError, match="for another Python"):
        kit.install(tmp_path / "kit")
    report.write_report(tmp_path, {"device": "H200", "ran_on": "cuda", "environment": {},
                                      "kit": "failed: the kit is for another Python"}, [], 1)
    assert "**The kit** (Hydra, OmegaConf, datasets) **did not install**" in (tmp_path / "gpu_check.md").read_text()


@pytest.mark.process
def test_a_check_told_to_stop_stops_its_sub_runs_and_keeps_its_report(tmp_path: Path) -> None:
    """SIGTERM to the check (a device call's own limit): the lines under way are 'skipped: out of time', their
    sub-runs (in sessions of their own) stopped whole, the report written, in seconds."""
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.gpu_check", "run", "--out", str(out), "--device", "cpu",
                             "--kit", str(tmp_path / "no-kit"), "--only", "resume", "--work", str(tmp_path / "work")],
                            cwd=ROOT, env=process_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for _ in range(1200):
            written = json.loads((out / "gpu_check.json").read_text()) if (out / "gpu_check.json").exists() else {}
            if any(line["status"] == "running" for line in written.get("lines", [])):
                break
            time.sleep(0.1)
        time.sleep(3)
        below = subruns.descendants(proc.pid)
        assert below, "the line started no sub-run"
        start = time.monotonic()
        proc.terminate()
        output, _ = proc.communicate(timeout=60)
        assert time.monotonic() - start < 3 * subruns.KILL_GRACE, output
    finally:
        if proc.poll() is None:
            proc.kill()
    written = json.loads((out / "gpu_check.json").read_text())
    status = {line["name"]: (line["status"], line["detail"]) for line in written["lines"]}
    assert status["resume"][0] == subruns.OUT_OF_TIME and "told to stop" in status["resume"][1], status
    assert written["stopped_by"] == "SIGTERM" and proc.returncode != 0
    assert "**The check was stopped by SIGTERM**" in (out / "gpu_check.md").read_text()
    time.sleep(1)
    assert not [pid for pid in below if alive(pid)], "sub-runs outlived the check"
