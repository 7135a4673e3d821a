"""The exported model's card, ``model/README.md``: what the Hugging Face Hub shows of a model.

Written with every export (nli.output.export), by huggingface_hub's own model card API, so that the Hub and
``ModelCard.load`` read it: the metadata block names the base model, the data set (GLUE's Hub id
``nyu-mll/glue`` with the task's config, or the task's own; files of your own by their names, GLUE unnamed), and the
best checkpoint's metrics as the Hub's ``model-index``; the text gives the hyperparameters, the framework
versions and the command that trains the same model again (with the commit of the code,
nli.runtime.provenance). Where the predictions of the evaluation it describes call for a warning (one class
for every example, NaN outputs: nli.evaluate.per_class), the card gives it too, as results.json does.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from huggingface_hub import EvalResult, ModelCard, ModelCardData

from nli.evaluate import per_class
from nli.evaluate.evaluation import Evaluation, Evaluator

CARD_FILE = "README.md"  # in model/, where the Hub looks for a model's card
TASK_TYPE = "text-classification"  # the Hub's task for GLUE (STS-B's regression included)
COMBINED = "combined_score"  # the mean of a task's metrics (nli.evaluate.metrics), its objective where it has several
# The settings a reader needs to train the same way, by their key in the resolved config: every key
# under these nodes, and these single keys.
HYPERPARAMETER_NODES = ("optimizer", "schedule")
HYPERPARAMETER_KEYS = ("train.batch_size", "train.epochs", "train.max_steps", "train.max_grad_norm",
                       "train.label_smoothing", "train.gradient_checkpointing", "data.max_seq_length",
                       "data.max_train_samples", "model.peft", "seed")


@dataclass(frozen=True)
class Card:
    """What a card says of a run besides the evaluation of the weights it describes."""

    config: Mapping[str, Any]  # the run's resolved config (nli.runtime.context.RunContext.resolved)
    provenance: Mapping[str, Any]  # results.json's provenance (nli.runtime.provenance.collect); empty where unknown
    evaluator: Optional[Evaluator] = None  # the task's, whose predictions the card's warnings read
    # results.json's warnings, for a card written again after the run finished: the evaluation then comes
    # from a checkpoint, which keeps no predictions, and the card gives those of the task's eval splits.
    recorded: Sequence[str] = ()
    # Where the run went on from a checkpoint with new values (train.accept_changes): results.json's `continued`.
    continued: Sequence[Mapping[str, Any]] = ()

    def render(self, evaluation: Evaluation, adapter: Optional[Mapping[str, Any]] = None) -> str:
        """The card of the weights that scored ``evaluation``, as ``README.md`` holds it; ``adapter``: the config
        of the LoRA adapter merged into them, as peft wrote it beside them (``adapter/adapter_config.json``)."""
        data = card_data(self.config, evaluation)
        if adapter is not None:
            data.tags = [*(data.tags or []), "lora"]
        summary = self._summary(evaluation) + (f" {_lora(adapter)}" if adapter is not None else "")
        sections = [summary, self._warnings(evaluation), _metrics_table(evaluation), _use(self.config),
                    self._hyperparameters(), self._framework(), self._reproduce()]
        body = "\n\n".join(section for section in sections if section)
        return str(ModelCard(f"---\n{data.to_yaml()}\n---\n\n{body}\n"))

    def _summary(self, evaluation: Evaluation) -> str:
        task, model = _task(self.config), _model(self.config)
        base = _base_model(self.config)
        source = (f"[{base}](https://huggingface.co/{base})" if base else
                  f"`{model.get('name_or_path')}`" if model.get("name_or_path") else "A model built from scratch "
                  "(`model.scratch`)")
        steps = f"step {evaluation.step}"
        return (f"# {model_name(self.config)}\n\n{source} fine-tuned on {_dataset_title(self.config)}, the "
                f"checkpoint of {steps} (the best by {task.get('main_metric')}: {evaluation.objective:.4f}), "
                "exported by nli-glue.")

    def _warnings(self, evaluation: Evaluation) -> str:
        """What the evaluation's predictions show that its figures do not, as results.json says it."""
        if self.evaluator is not None and evaluation.predictions:
            scored = [(self.evaluator, evaluation)]
            found = per_class.warnings_of(scored, per_class.analyse(scored))
        else:  # the task's splits' own (an extra set's are prefixed: hans/validation)
            found = [each for each in self.recorded if each.partition(": ")[0] in (_task(self.config).get(
                "eval_splits") or {})]
        return "## Warnings\n\n" + "\n".join(f"- {warning}" for warning in found) if found else ""

    def _hyperparameters(self) -> str:
        rows = [(key, value) for key, value in hyperparameters(self.config).items()]
        precision = (self.provenance.get("device") or {}).get("precision")
        if precision:
            rows.append(("precision (as computed)", precision))
        return "## Hyperparameters\n\n" + _table(("setting", "value"), rows)

    def _framework(self) -> str:
        versions = self.provenance.get("versions") or {}
        device = self.provenance.get("device") or {}
        rows: List[Tuple[str, Any]] = [(name, value) for name, value in versions.items() if value]
        if device:
            rows.append(("device", f"{device.get('name')} ({device.get('type')}, {device.get('processes')} "
                                   "process(es))"))
        return "## Framework versions\n\n" + (_table(("", "version"), rows) if rows else "Not recorded.")

    def _reproduce(self) -> str:
        command = self.provenance.get("command")
        commit = self.provenance.get("commit")
        if not self.provenance:  # a run finished before results.json recorded its provenance
            return "## Reproduce\n\nNot recorded: the run's config is in the run folder's config.yaml."
        if not command:
            return "## Reproduce\n\nThe run was started from Python: its config is in the run folder's config.yaml."
        lines = [f"git checkout {commit}"] if commit else []
        lines.append(str(command))
        note = (" The code had uncommitted changes when it ran: the commit alone does not hold them."
                if self.provenance.get("dirty") else "")
        if len(self.provenance.get("code_history") or []) > 1:
            note += (" Its steps ran under more than one version of the code (results.json's "
                     "provenance.code_history): this is its last attempt's.")
        if self.continued:
            went_on = "; ".join(f"at step {each.get('step')}, " + ", ".join(
                f"{key}: {change}" for key, change in (each.get("changes") or {}).items()) for each in self.continued)
            note += (f" The run went on from a checkpoint with new values (train.accept_changes; results.json's "
                     f"`continued`): {went_on}. The command is its last attempt's, which continued it: started "
                     "afresh with it, a run trains under the new values from its first step, another model. "
                     "Reproduced, it is the earlier values' run to that step, then this command.")
        code = f"the code of commit `{commit}`" if commit else "the installed nli-glue " + str(
            (self.provenance.get("versions") or {}).get("nli-glue") or "")
        return (f"## Reproduce\n\nWith {code}:{note}\n\n```bash\n" + "\n".join(lines) + "\n```")


def _use(config: Mapping[str, Any]) -> str:
    """How to predict as the evaluation did: its examples were cut to data.max_seq_length tokens, which pipeline does
    only when asked (a longer pair is otherwise scored whole, or refused past the model's positions)."""
    task, length = _task(config), (config.get("data") or {}).get("max_seq_length")
    if not length:
        return ""
    fields = [str(field) for field in task.get("text_fields") or ["text"]]
    given = f'{{"text": {fields[0]}, "text_pair": {fields[1]}}}' if len(fields) > 1 else fields[0]
    extra = ", top_k=None" if task.get("label_names") else ""  # every label's probability; a regression: its score
    return ("## Use\n\n```python\nfrom transformers import pipeline\n\n"
            'predict = pipeline("text-classification", model="path/to/this/model")\n'
            f"predict({given}, truncation=True, max_length={length}{extra})\n```\n\n"
            f"The evaluation above scored each example cut to {length} tokens (data.max_seq_length), as "
            f"`truncation=True, max_length={length}` cuts it; without them pipeline scores a longer example whole, "
            "or fails past the model's positions.")


def _lora(adapter: Mapping[str, Any]) -> str:
    """What LoRA trained, as the adapter's config records it: model.peft.target_modules=null names no module, and
    the family's default it stands for is what a reader needs (nli.model.lora.DEFAULT_TARGETS)."""
    targets = adapter.get("target_modules")
    named = ", ".join(f"`{name}`" for name in (sorted(targets) if isinstance(targets, list) else [targets]))
    return (f"Trained with LoRA (Hu et al. 2021) through peft: rank {adapter.get('r')}, alpha "
            f"{adapter.get('lora_alpha')}, dropout {adapter.get('lora_dropout')}, on the modules {named}; the "
            "classification head trained in full and every other weight frozen. The adapters are merged into these "
            "weights, which load without peft; the adapter itself is in `adapter/`.")


def card_data(config: Mapping[str, Any], evaluation: Evaluation) -> ModelCardData:
    """The card's metadata: base model, data set, and the evaluation as the Hub's model-index."""
    task = _task(config)
    dataset = dataset_id(config)
    base = _base_model(config)
    results = eval_results(config, evaluation) or None  # none at all: no model-index, whose results may not be empty
    return ModelCardData(model_name=model_name(config) if results else None, base_model=base,
                         datasets=[dataset] if dataset else None, library_name="transformers", pipeline_tag=TASK_TYPE,
                         tags=["nli-glue", str(task.get("name"))], eval_results=results,
                         metrics=_metric_names(task) or None)


def eval_results(config: Mapping[str, Any], evaluation: Evaluation) -> List[EvalResult]:
    """One EvalResult per metric of each eval split (accuracy on validation_matched, accuracy_mm on
    validation_mismatched), as the run names them; other figures stay in the text's table, and so do undefined
    ones (NaN: STS-B's correlations where the model gives every pair one score, or the gold scores are one): the
    Hub's model-index takes a number as a score the model reached, and the card's warning says why there is none."""
    task, files = _task(config), _own_files(config)
    # Files of your own are no Hub data set: named by the format the Hub's loader reads them with, and no config of
    # the task's Hub data set (GLUE's `rte`), whose figures these are not.
    dataset = dataset_id(config) or (_file_format(files) if files else str(task.get("name")))
    hub_config = None if files else task.get("hub_config")
    found = []
    for split, suffix in (task.get("eval_splits") or {}).items():
        for metric in _metric_names(task):
            key = f"{metric}{suffix}"
            if key in evaluation.metrics and math.isfinite(evaluation.metrics[key]):
                found.append(EvalResult(task_type=TASK_TYPE, task_name=str(task.get("name")), dataset_type=dataset,
                                        dataset_name=_dataset_title(config), dataset_config=hub_config,
                                        dataset_split=_split(config, str(split)), metric_type=metric, metric_name=key,
                                        metric_value=float(evaluation.metrics[key])))
    return found


def _split(config: Mapping[str, Any], split: str) -> str:
    """The split as scored: a part of it where data.max_eval_samples cut it (the Hub shows a model-index's figures
    as the split's, and a few examples' figures are not)."""
    most = (config.get("data") or {}).get("max_eval_samples")
    return f"{split} (at most its first {most} examples: data.max_eval_samples)" if most else split


def _metric_names(task: Mapping[str, Any]) -> List[str]:
    """The task's metrics, and their mean where it has several (as nli.evaluate.metrics reports them)."""
    names = [str(name) for name in task.get("metrics") or []]
    return [*names, *([COMBINED] if len(names) > 1 else [])]


def dataset_id(config: Mapping[str, Any]) -> Optional[str]:
    """The Hub id of the task's data set; None where the run read its own files (data.files) or
    generated them (task=synthetic). A local copy of GLUE's files (data.dir) is still GLUE."""
    if (config.get("data") or {}).get("files"):
        return None
    hub = _task(config).get("hub_dataset")
    return str(hub) if hub and not Path(str(hub)).exists() else None


def model_name(config: Mapping[str, Any]) -> str:
    """The model's name in the card: its base model's last part and the task (``roberta-large-mnli``)."""
    base = _model(config).get("name_or_path")
    stem = str(base).rstrip("/").split("/")[-1] if base else "scratch"
    return f"{stem}-{_task(config).get('name')}"


def hyperparameters(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The settings of :data:`HYPERPARAMETER_NODES` and :data:`HYPERPARAMETER_KEYS` that are set, by dotted key."""
    chosen: Dict[str, Any] = {}
    for node in HYPERPARAMETER_NODES:
        for key, value in (config.get(node) or {}).items():
            if value is not None:  # _target_: the optimizer's class, the schedule's function
                chosen[node if key == "_target_" else f"{node}.{key}"] = value
    for dotted in HYPERPARAMETER_KEYS:
        found: Any = config
        for part in dotted.split("."):
            found = found.get(part) if isinstance(found, Mapping) else None
        if found is not None:
            chosen[dotted] = found
    return chosen


def _base_model(config: Mapping[str, Any]) -> Optional[str]:
    """model.name_or_path where it is a Hub id; None for a local checkpoint or a model from scratch."""
    name = _model(config).get("name_or_path")
    if not name or "://" in str(name) or Path(str(name)).exists():
        return None
    return str(name)


def _dataset_title(config: Mapping[str, Any]) -> str:
    """What the model was trained and scored on, for a reader: GLUE's task, or the files of your own (data.files) by
    their names, which GLUE's title would have passed off as GLUE's (their figures are not GLUE's)."""
    task, files = _task(config), _own_files(config)
    name = str(task.get("name"))
    if files:
        named = ", ".join(f"{split}: {PurePosixPath(str(path)).name}" for split, path in files.items())
        return f"your own data for task {name} ({named})"
    if task.get("hub_dataset") == "nyu-mll/glue":
        return f"GLUE {name.upper()}"
    return name


def _own_files(config: Mapping[str, Any]) -> Mapping[str, Any]:
    """data.files: split -> the file of your own the run read it from (none where it read the task's data set)."""
    return (config.get("data") or {}).get("files") or {}


def _file_format(files: Mapping[str, Any]) -> str:
    """The Hub's loader of the files (``csv``, ``json``, ``parquet``), as ``datasets.load_dataset`` names it."""
    suffix = PurePosixPath(str(next(iter(files.values())))).suffix.lstrip(".")
    return {"tsv": "csv", "jsonl": "json"}.get(suffix, suffix)


def _task(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("task") or {}


def _model(config: Mapping[str, Any]) -> Mapping[str, Any]:
    return config.get("model") or {}


def _metrics_table(evaluation: Evaluation) -> str:
    rows = [(name, f"{value:.4f}") for name, value in evaluation.metrics.items()]
    return f"## Evaluation (step {evaluation.step})\n\n" + _table(("metric", "value"), rows)


def _table(header: Tuple[str, str], rows: List[Tuple[str, Any]]) -> str:
    lines = [f"| {header[0]} | {header[1]} |", "|---|---|"]
    lines += [f"| {key} | {_cell(value)} |" for key, value in rows]
    return "\n".join(lines)


def _cell(value: Any) -> str:
    text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return text.replace("|", "\\|")
