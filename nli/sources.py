"""Where a task's raw examples come from: the Hub, a local GLUE directory, or files of your own.

Every source gives each split the same columns, so that the rest of the pipeline cannot tell
them apart: the task's text fields, ``label`` (the Hub's label id; a float for STS-B; -1 where a
test file has no labels) and ``idx`` (the example's number, written into test predictions).
Local files are read into the ``datasets`` cache once, keyed by their path, size and
modification time, so tokenizing them is cached like the Hub's data.
"""

from __future__ import annotations

import csv
import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple

import datasets
from datasets.exceptions import DatasetGenerationError

from nli import synthetic
from nli.config import DataConfig, GlueFilesConfig, TaskConfig
from nli.errors import DataError
from nli.hub import hub_download

log = logging.getLogger(__name__)

NO_LABEL = -1  # the label of an unlabelled (test) example, as on the Hub

# Where the synthetic task's splits come from: fixed seeds, so the task is the same whatever
# the run's seed is.
SYNTHETIC_SEEDS = {"train": 0, "validation": 1}

# `datasets` builders for the formats data.files accepts, and their reading options.
FILE_FORMATS: Dict[str, tuple[str, Dict[str, Any]]] = {
    ".csv": ("csv", {"keep_default_na": False}),  # "NA" and "null" are text, not missing values
    ".tsv": ("csv", {"sep": "\t", "keep_default_na": False}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}


def load(task: TaskConfig, data: DataConfig, splits: List[str]) -> Dict[str, datasets.Dataset]:
    """``splits`` of ``task`` from the source ``data`` selects: files, a GLUE dir, or the Hub."""
    if data.files:
        return {split: _from_file(task, Path(data.files[split]), data.columns) for split in splits}
    if data.dir is not None:
        assert task.glue is not None  # the config checked it
        return {split: _from_glue_dir(task, task.glue, Path(data.dir), split) for split in splits}
    if task.is_generated:
        return {split: _synthetic(data, split) for split in splits}
    return _from_hub(task, splits)


# ------------------------------------------------------------------------------------- labels


def label_lookup(task: TaskConfig) -> Dict[str, int]:
    """Every way a file may write each label: its name, GLUE's own value, and its id."""
    lookup: Dict[str, int] = {}
    for i, (name, value) in enumerate(zip(task.label_names, task.file_labels)):
        lookup.update({name: i, value: i, str(i): i})
    return lookup


def parse_label(value: Any, task: TaskConfig, lookup: Dict[str, int], where: str) -> float | int:
    """The label id (the score, for regression) that ``value`` stands for; ``where`` names the
    file and row for the error."""
    if task.is_regression:
        try:
            return float(value)
        except (TypeError, ValueError):
            raise DataError(f"{where}: the score {value!r} is not a number") from None
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.strip() in lookup:
        return lookup[value.strip()]
    known = ", ".join(dict.fromkeys([*task.label_names, *task.file_labels]))
    raise DataError(f"{where}: unknown label {value!r} for task {task.name}; known labels: {known} "
                    f"(or their ids 0-{task.num_labels - 1})")


# ---------------------------------------------------------------------------- GLUE directory


def _from_glue_dir(task: TaskConfig, glue: GlueFilesConfig, root: Path, split: str) -> datasets.Dataset:
    folder = root.expanduser() / glue.folder
    path = folder / glue.files[split]
    if not path.is_file():
        expected = ", ".join(sorted(set(glue.files.values())))
        where = f"{folder} does not exist" if not folder.is_dir() else f"{path} does not exist"
        raise DataError(f"data.dir={root}: {where}. A GLUE directory holds one folder per task "
                        f"({glue.folder}/ for {task.name}) with the files {expected}, as the "
                        "original GLUE download lays them out")
    stat = path.stat()
    kwargs = {"path": str(path.resolve()), "stamp": f"{stat.st_size}-{stat.st_mtime_ns}",
              # A tuple: from_generator would split a list into shards.
              "task": task, "header": tuple(glue.header) if split in glue.headerless else None}
    try:
        return datasets.Dataset.from_generator(_read_glue_tsv, gen_kwargs=kwargs, features=_features(task),
                                               split=datasets.NamedSplit(split))
    except DatasetGenerationError as err:  # the builder wraps what the reader raised
        if isinstance(err.__cause__, DataError):
            raise err.__cause__ from None
        raise


def _read_glue_tsv(path: str, stamp: str, task: TaskConfig,
                   header: Optional[Tuple[str, ...]]) -> Iterator[Dict[str, Any]]:
    """Rows of one GLUE file, as GLUE's own loader reads them: tab-separated with no quoting
    (quotes in QQP and SST-2 are text), optionally without a header row (CoLA's train and dev).
    ``stamp`` (size and mtime) is only there to key the ``datasets`` cache."""
    assert task.glue is not None
    columns, index_column = task.glue.columns, task.glue.index_column
    lookup = label_lookup(task)
    skipped: List[int] = []
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: MRPC's files may start with a BOM
        reader = csv.DictReader(f, fieldnames=header, delimiter="\t", quoting=csv.QUOTE_NONE)
        has_labels = columns["label"] in (reader.fieldnames or [])  # GLUE's test files have none
        for n, row in enumerate(reader):
            line = n + (1 if header is not None else 2)
            if None in row.values():  # fewer fields than the header; the Hub's copy drops these too
                skipped.append(line)
                continue
            label = parse_label(row[columns["label"]], task, lookup, f"{path}, line {line}") if has_labels \
                else NO_LABEL
            index = row.get(index_column)
            yield {**{field: row[columns[field]] for field in task.text_fields}, "label": label,
                   "idx": int(index) if index is not None and index.isdigit() else n}
    if skipped:
        log.warning("%s: skipped %d row(s) with missing fields (lines %s)", path, len(skipped),
                    ", ".join(map(str, skipped[:10])) + (", ..." if len(skipped) > 10 else ""))


def _features(task: TaskConfig) -> datasets.Features:
    label = datasets.Value("float32") if task.is_regression else datasets.Value("int64")
    return datasets.Features({**{field: datasets.Value("string") for field in task.text_fields},
                              "label": label, "idx": datasets.Value("int64")})


# ------------------------------------------------------------------------------ your own files


def _from_file(task: TaskConfig, path: Path, columns: Dict[str, str]) -> datasets.Dataset:
    """A csv, tsv, jsonl or parquet file with a header; ``columns`` maps the task's text fields
    and ``label`` to the file's column names where they differ."""
    path = path.expanduser()
    if not path.is_file():
        raise DataError(f"data.files: {path} does not exist")
    if path.suffix not in FILE_FORMATS:
        raise DataError(f"data.files: {path} is not one of the formats {sorted(FILE_FORMATS)}")
    builder, options = FILE_FORMATS[path.suffix]
    ds = datasets.load_dataset(builder, data_files=str(path.resolve()), split="train", **options)
    wanted = {field: columns.get(field, field) for field in [*task.text_fields, "label"]}
    missing = [f"{column} (for {field})" for field, column in wanted.items()
               if column not in ds.column_names and field != "label"]
    if missing:
        raise DataError(f"{path} has no column {', '.join(missing)}; its columns are {ds.column_names}. "
                        f"Map them with data.columns, e.g. +data.columns.{task.text_fields[0]}=<column>")
    lookup = label_lookup(task)
    has_labels = wanted["label"] in ds.column_names

    def convert(row: Dict[str, Any], i: int) -> Dict[str, Any]:
        label = parse_label(row[wanted["label"]], task, lookup, f"{path}, row {i + 1}") if has_labels \
            else NO_LABEL
        return {**{field: row[wanted[field]] for field in task.text_fields}, "label": label, "idx": i}

    return ds.map(convert, with_indices=True, remove_columns=ds.column_names, features=_features(task),
                  desc=f"read {path.name}")


# ------------------------------------------------------------------------------- Hub, synthetic


def _from_hub(task: TaskConfig, splits: List[str]) -> Dict[str, datasets.Dataset]:
    assert task.hub_dataset is not None
    if os.path.isdir(task.hub_dataset):  # a local copy of the dataset's Hub repository
        raw = datasets.load_dataset(task.hub_dataset, task.hub_config)
    else:
        with hub_download(f"dataset '{task.hub_dataset}' ({task.hub_config})"):
            raw = datasets.load_dataset(task.hub_dataset, task.hub_config)
    missing = [split for split in splits if split not in raw]
    if missing:
        raise DataError(f"dataset '{task.hub_dataset}' ({task.hub_config}) has no split {missing}; "
                        f"it has {list(raw)}")
    return {split: _with_idx(raw[split]).select_columns([*task.text_fields, "label", "idx"]) for split in splits}


def _with_idx(ds: datasets.Dataset) -> datasets.Dataset:
    return ds if "idx" in ds.column_names else ds.add_column("idx", list(range(len(ds))))


def _synthetic(data: DataConfig, split: str) -> datasets.Dataset:
    if split not in SYNTHETIC_SEEDS:
        raise DataError(f"the synthetic task has the splits {list(SYNTHETIC_SEEDS)}, not {split}")
    size = data.synthetic_train_size if split == "train" else data.synthetic_eval_size
    return _with_idx(datasets.Dataset.from_dict(synthetic.generate(size, seed=SYNTHETIC_SEEDS[split])))
