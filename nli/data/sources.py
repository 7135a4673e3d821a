"""Where a task's raw examples come from: the Hub, a local GLUE directory, or files of your own.

Every source gives each split the same columns, so that the rest of the pipeline cannot tell
them apart: the task's text fields, ``label`` (the Hub's label id; a float for STS-B; -1 where a
test file has no labels, or an example has no gold label: SNLI's "-"), ``idx`` (the example's
number, written into test predictions: a test file of your own keeps its ids, numbers or text) and
the task's ``groups`` columns (HANS's heuristic).
An original download is read as its files are laid out: GLUE's and HANS's tab-separated files,
SNLI's and ANLI's JSON Lines.
Local files are read into the ``datasets`` cache once, keyed by their path, size and
modification time, so tokenizing them is cached like the Hub's data. Files in a bucket
(``data.dir=gs://...``, ``data.files.train=gs://...``) are fetched into a local cache first,
keyed by the object's generation (nli/io/remote.py), and then read as local files are.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import math
import os
import shutil
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import datasets
from datasets.exceptions import DatasetGenerationError
from pandas.errors import ParserWarning

from nli.config import paths
from nli.config.schema import DIAGNOSTIC_SPLIT, DataConfig, GlueFilesConfig, TaskConfig
from nli.data import synthetic
from nli.errors import DataError, UserError
from nli.io import remote
from nli.io.hub import hub_download

log = logging.getLogger(__name__)

NO_LABEL = -1  # the label of an unlabelled (test) example, or of one with no gold label, as on the Hub

# Where the synthetic task's splits come from: fixed seeds, so the task is the same whatever
# the run's seed is.
SYNTHETIC_SEEDS = {"train": 0, "validation": 1}

# The columns a test file (data.files) may keep its own ids in, the first found taken: its predictions keep them.
ID_COLUMNS = ("idx", "index", "id")
# `datasets` builders for the formats data.files accepts, and their reading options. A CSV's or TSV's every column is
# read as the text it holds (_as_text), not as pandas guesses its type.
FILE_FORMATS: Dict[str, tuple[str, Dict[str, Any]]] = {
    # "NA" and "null" are text, not missing values. index_col=False: where each row had a field more than the header
    # (a comma at each line's end, an id after the label), pandas made the first column the index, and read every
    # other field into the column before its own: the second text as the first, the id as the label.
    ".csv": ("csv", {"keep_default_na": False, "index_col": False}),
    # A quote is text, as in every GLUE file: with quoting on, a field that opens a quote swallowed the rows up to
    # the next one (100 rows read as 98, three merged into one example).
    ".tsv": ("csv", {"sep": "\t", "keep_default_na": False, "quoting": csv.QUOTE_NONE, "index_col": False}),
    ".jsonl": ("json", {}),
    ".json": ("json", {}),
    ".parquet": ("parquet", {}),
}
# What a file of each format with no examples holds: a JSON or JSON Lines file was said to have "a header row".
_EMPTY_AS = {".csv": "it has a header row and nothing else", ".tsv": "it has a header row and nothing else",
             ".jsonl": "it holds no JSON object, only blank lines",
             ".json": "it holds no record (an empty list or object)", ".parquet": "it has no rows"}
# How the messages name each format.
FORMAT_NAMES = {".csv": "CSV", ".tsv": "TSV", ".jsonl": "JSON Lines", ".json": "JSON", ".parquet": "Parquet"}


def load(task: TaskConfig, data: DataConfig, splits: List[str], *, dir_key: str = "data.dir",
         notes: Optional[List[str]] = None) -> Dict[str, datasets.Dataset]:
    """``splits`` of ``task`` from the source ``data`` selects: files, a folder of original downloads
    (a GLUE dir), or the Hub. ``dir_key`` is the key that set ``data.dir``, for the messages; ``notes`` gets a line
    for each GLUE file whose rows were skipped (:func:`_say_skipped`)."""
    if data.files:
        return {split: _from_file(task, data.files[split], data.columns, labelled=split not in task.test_splits)
                for split in splits}
    if data.dir is not None:
        assert task.glue is not None  # the config checked it
        said = notes if notes is not None else []
        return {split: _from_glue_dir(task, task.glue, data.dir, split, dir_key, splits, said) for split in splits}
    if task.is_generated:
        return {split: _synthetic(data, split) for split in splits}
    return _from_hub(task, splits, dir_key)


def same_file_key(name: str) -> str:
    """What tells two of data.files' names of one file apart from two files: a local file's real path (another
    spelling, a link), a bucket's URL as it is."""
    return name if remote.is_remote(name) else str(Path(name).expanduser().resolve())


# ------------------------------------------------------------------------------------- labels


def label_lookup(task: TaskConfig) -> Dict[str, int]:
    """Every way a file may write each label: its name, GLUE's own value, and its id, except where the names are
    numbers that are other labels' ids (a task's star ratings ``1``-``5``, ids 0-4): there a file's ``1`` could be
    either, and is read as the name. Where ids came after the names, id 1 overwrote the name ``1`` (label 0), and the
    labels shifted unsaid."""
    named: Dict[str, int] = {}
    for i, (name, value) in enumerate(zip(task.label_names, task.file_labels)):
        named.update({name: i, value: i})
    ids = {str(i): i for i in range(len(task.label_names))}
    if any(named.get(text, i) != i for text, i in ids.items()):
        return named
    return {**ids, **named}


def parse_label(value: Any, task: TaskConfig, lookup: Dict[str, int], where: str) -> float | int:
    """The label id (the score, for regression) that ``value`` stands for, or NO_LABEL where it says
    the example has no gold label (task.no_gold_label, or the Hub's own -1 where no label is named so: a split
    saved from the Hub to a file, its test split's every row); ``where`` names the file and row for the error."""
    if task.no_gold_label is not None and isinstance(value, str) and value.strip() == task.no_gold_label:
        return NO_LABEL
    if task.is_regression:
        return _score(value, where)
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if isinstance(value, str) and value.strip() in lookup:
        return lookup[value.strip()]
    whole = _whole_number(value)  # 1.0: a column of ids read as decimals (a CSV with 1.0, or an empty cell)
    if whole is not None and str(whole) in lookup:
        return lookup[str(whole)]
    if whole == NO_LABEL:
        return NO_LABEL
    known = ", ".join(dict.fromkeys([*task.label_names, *task.file_labels]))
    no_gold = f", and {task.no_gold_label!r} for no gold label" if task.no_gold_label is not None else ""
    by_id = all(lookup.get(str(i)) == i for i in range(task.num_labels))
    ids = (f" (or their ids 0-{task.num_labels - 1})" if by_id else
           " (by name alone: the names are numbers that are other labels' ids)")
    raise DataError(f"{where}: {_unknown(value)} for task {task.name}; known labels: {known}{ids}{no_gold}")


def _score(value: Any, where: str) -> float:
    """A regression's gold score: a finite number. NaN or infinity (written so, or an empty cell read as NaN) made
    training stop on a loss of NaN that blamed the learning rate, and a dev set score NaN without a word."""
    if _empty(value):
        raise DataError(f"{where}: no score (the label column is empty there): give each labelled example its score")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise DataError(f"{where}: the score {value!r} is not a number") from None
    if not math.isfinite(score):  # as written: a CSV's column of numbers gives the float, a column of text the text
        raise DataError(f"{where}: the score {str(value)!r} is not a finite number: give each labelled example a "
                        "finite score")
    return score


def _empty(value: Any) -> bool:
    """A label cell with nothing in it, as a file's reader gives it (None, NaN, blank text)."""
    return value is None or (isinstance(value, float) and math.isnan(value)) or str(value).strip() == ""


def _whole_number(value: Any) -> Optional[int]:
    """The whole number a label written as a decimal stands for (1.0, "1.0"); None for any other value."""
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


def _unknown(value: Any) -> str:
    """What is wrong with a label that names none of the task's, said for what it is."""
    if _empty(value):
        return "no label (the label column is empty there)"
    if isinstance(value, float) and not value.is_integer():
        return (f"unknown label {value!r} (the label column was read as decimal numbers: a label id is a whole "
                "number, 0, 1, ...)")
    if _decimal(value):  # a CSV's or TSV's, read as the text it holds
        return f"unknown label {value!r} (a decimal number: a label id is a whole number, 0, 1, ...)"
    return f"unknown label {value!r}"


def _decimal(value: Any) -> bool:
    """Whether ``value`` is text of a finite number that is not whole (0.5)."""
    if not isinstance(value, str):
        return False
    try:
        number = float(value)
    except ValueError:
        return False
    return math.isfinite(number) and not number.is_integer()


# ---------------------------------------------------------------------------- GLUE directory


def _from_glue_dir(task: TaskConfig, glue: GlueFilesConfig, root: str, split: str, key: str,
                   needed: List[str], notes: List[str]) -> datasets.Dataset:
    """``needed``: every split this run reads from the folder, which a missing file's message lists."""
    if remote.is_remote(root):  # a bucket has no folders to check: the file is there or not
        url = f"{root.rstrip('/')}/{glue.folder}/{glue.files[split]}"
        if not remote.exists(url):
            raise DataError(paths.not_glue_dir(task, glue, root, f"{url} does not exist", key, needed))
        path = remote.local_copy(url)
        with remote.named_as(url, path):
            return _say_skipped(_read_glue_file(task, glue, path, split), path, url, _glue_header(glue, split), notes)
    path = paths.glue_file(task, glue, root, split, key, needed)
    return _say_skipped(_read_glue_file(task, glue, path, split), path, str(path), _glue_header(glue, split), notes)


def _read_glue_file(task: TaskConfig, glue: GlueFilesConfig, path: Path, split: str, *,
                    labelled: Optional[bool] = None) -> datasets.Dataset:
    """``labelled``: whether the file must have labels; None: unless ``split`` is a test split."""
    stat = path.stat()
    kwargs = {"path": str(path.resolve()), "stamp": f"{stat.st_size}-{stat.st_mtime_ns}",
              "task": task, "labelled": split not in task.test_splits if labelled is None else labelled}
    if path.suffix == ".jsonl":
        reader: Any = _read_jsonl
    else:
        reader, kwargs["header"] = _read_glue_tsv, _glue_header(glue, split)
    try:
        # A reader that fails leaves nothing in the cache: the builder writes into a temporary folder.
        return datasets.Dataset.from_generator(reader, gen_kwargs=kwargs, features=_features(task),
                                               split=datasets.NamedSplit(split))
    except DatasetGenerationError as err:  # the builder wraps what the reader raised
        if isinstance(err.__cause__, DataError):
            raise err.__cause__ from None
        raise


def _read_glue_tsv(path: str, stamp: str, task: TaskConfig, header: Optional[Tuple[str, ...]],
                   labelled: bool) -> Iterator[Dict[str, Any]]:
    """Rows of one GLUE file, as GLUE's own loader reads them: tab-separated with no quoting
    (quotes in QQP and SST-2 are text), optionally without a header row (CoLA's train and dev).
    A ``labelled`` split (train, dev) must have the label column; GLUE's test files have none.
    ``stamp`` (size and mtime) is only there to key the ``datasets`` cache: an edited file is read again."""
    assert task.glue is not None
    _lift_csv_field_limit()
    lookup = label_lookup(task)
    skipped: List[int] = []
    extra: List[int] = []  # more fields than the header: a tab inside a text
    examples = 0
    ids: Dict[int, int] = {}  # a test file's: each example's id, at its line (its predictions are numbered by them)
    with open(path, encoding="utf-8-sig", newline="") as f:  # -sig: MRPC's files may start with a BOM
        reader = csv.DictReader(f, fieldnames=header, delimiter="\t", quoting=csv.QUOTE_NONE)
        try:
            has_labels = _check_glue_columns(path, task, reader.fieldnames, labelled)
            for n, row in enumerate(reader):
                line = n + (1 if header is not None else 2)
                fault = _row_fault(row)
                if fault is not None:
                    (skipped if fault == _MISSING else extra).append(line)
                    continue
                examples += 1
                if not labelled:
                    _check_glue_id(row, task, f"{path}, line {line}")
                example = _glue_example(row, n, task, lookup, f"{path}, line {line}" if has_labels else None)
                if not labelled and ids.setdefault(example["idx"], line) != line:
                    raise DataError(f"{path}: the id {example['idx']} (column '{task.glue.index_column}') is on lines "
                                    f"{ids[example['idx']]} and {line}. A test file's ids number its predictions, each "
                                    "its own: restore the file from GLUE's download")
                yield example
        except UnicodeDecodeError as err:
            raise DataError(_not_utf8(Path(path), err)) from None
        except csv.Error as err:
            raise DataError(f"{path}, line {reader.line_num}: {err}") from None
    if not examples:
        why = ("it is empty" if os.path.getsize(path) == 0 else
               f"each of its {len(skipped) + len(extra)} row(s) has missing or extra fields" if skipped or extra else
               "it has a header row and nothing else")
        raise DataError(_no_examples(Path(path), why))


# Why a GLUE file's row is skipped (_row_fault), as the messages say it
_MISSING = "with missing fields"
_EXTRA = "with more fields than the header (a tab inside a text shifts the columns after it)"


def _row_fault(row: Dict[Any, Any]) -> Optional[str]:
    """Why a GLUE file's row (as csv.DictReader reads it) is skipped, as the Hub's copy drops it; None: it is not."""
    if None in row.values():  # fewer fields than the header
        return _MISSING
    # csv's key for fields past the header's (an empty one, a tab at the line's end, shifts nothing): each column
    # after a tab inside a text held the one before it (MRPC's second sentence the first's end)
    if any(field.strip() for field in row.get(None) or ()):
        return _EXTRA
    return None


def _glue_header(glue: GlueFilesConfig, split: str) -> Optional[Tuple[str, ...]]:
    """The columns of ``split``'s GLUE file where its first row is no header (CoLA's train and dev); None: it is.
    A tuple: from_generator would split a list into shards."""
    return tuple(glue.header) if split in glue.headerless else None


def _say_skipped(ds: datasets.Dataset, path: Path, shown: str, header: Optional[Tuple[str, ...]],
                 notes: List[str]) -> datasets.Dataset:
    """``ds``, read from the GLUE file at ``path`` (``shown``: its name for the user), with a line in ``notes`` (the
    run's warnings: log and results.json) for each kind of row its reader skipped (:func:`_row_fault`). Counted
    from the file on every run: the reader runs on the first alone, ``datasets`` caching what it read, and a later
    run said nothing. The rows are looked for only where the file has more than ``ds`` (its header and blank lines
    aside), as it seldom does."""
    if path.suffix == ".jsonl":
        return ds
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        rows = sum(1 for line in f if line.strip("\r\n"))
    if rows <= len(ds) + (header is None):
        return ds
    faults: Dict[str, List[int]] = {_MISSING: [], _EXTRA: []}
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.DictReader(f, fieldnames=header, delimiter="\t", quoting=csv.QUOTE_NONE)
        for row in reader:
            fault = _row_fault(row)
            if fault is not None:
                faults[fault].append(reader.line_num)  # one line a row: no field is quoted
    for what, lines in faults.items():
        if lines:
            shown_lines = ", ".join(map(str, lines[:10])) + (", ..." if len(lines) > 10 else "")
            notes.append(f"{shown}: skipped {len(lines)} row(s) {what} (lines {shown_lines}): the run read "
                         f"{len(ds)} examples from it. Restore the file from its download, or mend those lines")
    return ds


def _check_glue_id(row: Dict[str, Any], task: TaskConfig, where: str) -> None:
    """A GLUE test file's id is a whole number, as GLUE's are; any other was replaced by the row's number unsaid, and
    the predictions named examples the file does not. A file of your own keeps ids of text (data.files)."""
    assert task.glue is not None
    column = task.glue.index_column
    if column in row and not str(row[column]).isdigit():
        raise DataError(f"{where}: the id {row[column]!r} (column '{column}') is not a whole number, as GLUE's test "
                        "files' ids are, and its predictions keep them: restore the file from GLUE's download, or give "
                        "it as a file of your own (+data.files.<split>=...), whose ids may be text")


def _glue_example(row: Dict[str, Any], n: int, task: TaskConfig, lookup: Dict[str, int],
                  labelled_at: Optional[str]) -> Dict[str, Any]:
    """One example of an original file's row ``n``; ``labelled_at`` names its file and line, for a row with a label."""
    assert task.glue is not None
    columns = task.glue.columns
    label = parse_label(row[columns["label"]], task, lookup, labelled_at) if labelled_at else NO_LABEL
    index = str(row.get(task.glue.index_column, ""))
    return {**{field: row[columns[field]] for field in [*task.text_fields, *task.groups]}, "label": label,
            "idx": int(index) if index.isdigit() else n}


def _read_jsonl(path: str, stamp: str, task: TaskConfig, labelled: bool) -> Iterator[Dict[str, Any]]:
    """Examples of an original JSON Lines file (SNLI's, ANLI's): one object per line, its fields named
    by task.glue.columns; a field the file lacks may go by the task's own name (``premise``, as the
    Hub's copies name it). ``stamp`` (size and mtime) only keys the ``datasets`` cache."""
    assert task.glue is not None
    lookup = label_lookup(task)
    examples = 0
    with open(path, encoding="utf-8-sig") as f:  # -sig: a file saved with a BOM
        try:
            for n, line in enumerate(f, start=1):
                if not line.strip():
                    continue
                row = _json_row(line, f"{path}, line {n}")
                named = _jsonl_columns(row, task, labelled, f"{path}, line {n}")
                examples += 1
                labelled_at = f"{path}, line {n}" if task.glue.columns["label"] in named else None
                yield _glue_example(named, examples - 1, task, lookup, labelled_at)
        except UnicodeDecodeError as err:
            raise DataError(_not_utf8(Path(path), err)) from None
    if not examples:
        why = "it is empty" if os.path.getsize(path) == 0 else "it has no lines with an object"
        raise DataError(_no_examples(Path(path), why))


def _json_row(line: str, where: str) -> Dict[str, Any]:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as err:
        raise DataError(f"{where}: not valid JSON: {err.msg} at column {err.colno}; a .jsonl file holds one "
                        "JSON object per line") from None
    if not isinstance(row, dict):
        raise DataError(f"{where}: {type(row).__name__} where a JSON object was expected; a .jsonl file holds "
                        "one JSON object per line")
    return row


def _jsonl_columns(row: Dict[str, Any], task: TaskConfig, labelled: bool, where: str) -> Dict[str, Any]:
    """The row's fields under the names task.glue.columns gives (each field's own name where the file uses
    that); a text field that is missing or not text is a DataError naming the line."""
    assert task.glue is not None
    columns = task.glue.columns
    named: Dict[str, Any] = {}
    for field in [*task.text_fields, *task.groups, "label"]:
        column = columns[field] if columns[field] in row or field not in row else field
        if column not in row:
            if field == "label" and not labelled:
                continue  # a test file without labels
            named_as = f" (for {field})" if columns[field] != field else ""
            raise DataError(f"{where}: no field '{columns[field]}'{named_as}; the line has the fields {sorted(row)}. "
                            f"Each {task.glue.folder} file of the original download has the fields "
                            f"{sorted(columns.values())}: use the original file")
        if field != "label" and not isinstance(row[column], str):
            raise DataError(f"{where}: '{column}' is {row[column]!r}, not text")
        named[columns[field]] = row[column]
    if task.glue.index_column in row:
        named[task.glue.index_column] = row[task.glue.index_column]
    return named


def _check_glue_columns(path: str, task: TaskConfig, fieldnames: Optional[Sequence[str]], labelled: bool) -> bool:
    """Whether the file has labels; a DataError naming the columns it lacks."""
    assert task.glue is not None
    if not fieldnames:  # an empty file: no examples, said once the rows are counted
        return False
    columns = task.glue.columns
    wanted = [*task.text_fields, *task.groups, *(["label"] if labelled else [])]
    missing = [f"'{columns[field]}'" + (f" (for {field})" if columns[field] != field else "")
               for field in wanted if columns[field] not in fieldnames]
    if missing:
        raise DataError(f"{path}: no column {', '.join(missing)}; its header (line 1) has the columns "
                        f"{list(fieldnames)}. Each {task.glue.folder} file of the original GLUE download has a "
                        f"header with the columns {sorted(columns[field] for field in wanted)}: fix the header, or "
                        "use the original file")
    return columns["label"] in fieldnames


def _lift_csv_field_limit() -> None:
    """The csv module refuses fields over 128 KiB; a long document is data, not an error. The largest
    limit the platform's C long takes, as pandas and others do."""
    limit = sys.maxsize
    while True:
        try:
            csv.field_size_limit(limit)
            return
        except OverflowError:
            limit //= 2


def _no_examples(path: Path, why: str) -> str:
    return (f"{path} has no examples: {why}. Every split needs at least one: check that it is the file meant, "
            "and that it was written out completely")


def _not_utf8(path: Path, err: UnicodeDecodeError) -> str:
    bad = _first_bad_line(path)
    return f"{path}, line {bad[0]}: {bad[1]}" if bad else f"{path}: not UTF-8 text ({err.reason})"


def _first_bad_line(path: Path, *, json_lines: bool = False) -> Optional[Tuple[int, str]]:
    """The first line that is not UTF-8 text (in a JSON Lines file, or not one JSON value), and what is
    wrong with it. Line by line, since a decoder reading in blocks cannot say which line failed."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, start=1):
            try:
                text = raw.decode("utf-8-sig" if n == 1 else "utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                return n, (f"byte {raw[err.start]:#04x} (byte {err.start + 1} of the line) is not UTF-8 text; "
                           "the file must be UTF-8 text: save it as UTF-8 (or convert it, e.g. with iconv)")
            if json_lines and text.strip():
                try:
                    json.loads(text)
                except json.JSONDecodeError as err:
                    return n, (f"not valid JSON: {err.msg.removesuffix(' at')} at column {err.colno}; a .jsonl "
                               "file holds one JSON object per line")
    return None


def _first_ragged_row(path: Path, said: str) -> Optional[Tuple[int, str]]:
    """The line of a CSV's or TSV's first row with more fields than its header, or of a CSV's quote that pandas found
    never closes (``said``: its error), and the fix. pandas said "Error tokenizing data. C error: Expected 3 fields in
    line 4, saw 4", and the message went on to name the formats data.files takes, as if the file were of another."""
    tsv = path.suffix == ".tsv"
    _lift_csv_field_limit()
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:
        reader = csv.reader(f, delimiter="\t" if tsv else ",", quoting=csv.QUOTE_NONE if tsv else csv.QUOTE_MINIMAL)
        width, line, start = None, 1, 1  # start: the line the last row read began on
        for row in reader:
            if width is None:
                width = len(row)
                other = _other_separator(path, row)  # a row's text with our separator, not the cause, would be blamed
                if other:
                    return 1, f"the header reads as one column, {row[0]!r}. {other}"
            elif len(row) > width and any(field.strip() for field in row[width:]):  # an empty one shifts nothing
                cause = _ragged_cause(tsv, line, reader.line_num)
                return line, f"{len(row)} fields where the header has {width}; {cause}"
            start, line = line, reader.line_num + 1
    if "EOF inside string" in said:  # the quote opened the last row, which ran to the file's end
        return start, ('a field opens a quote (") that never closes, and takes in every line after it: close it, or '
                       'write a quote inside a text as two ("")')
    return None


def _ragged_cause(tsv: bool, line: int, end: int) -> str:
    """Why a row from ``line`` to ``end`` has more fields than the header, and the fix."""
    if end > line:  # a quote left open joined the lines up to the next one's quote: their fields, one row
        return (f'a field opens a quote (") that closes only on line {end}, taking in the lines between: close it, or '
                'write a quote inside a text as two ("")')
    if tsv:
        return "the likely cause is a tab inside a text: replace it with a space"
    return 'the likely cause is a comma inside a text: put that text in double quotes ("a, b"), as a CSV writer does'


def _features(task: TaskConfig, *, text_ids: bool = False) -> datasets.Features:
    """The columns every source gives; ``idx`` is text where a test file's own ids are (``text_ids``)."""
    label = datasets.Value("float32") if task.is_regression else datasets.Value("int64")
    return datasets.Features({**{field: datasets.Value("string") for field in [*task.text_fields, *task.groups]},
                              "label": label, "idx": datasets.Value("string" if text_ids else "int64")})


# ------------------------------------------------------------------------------ your own files


def _from_file(task: TaskConfig, name: str, columns: Dict[str, str], *, labelled: bool) -> datasets.Dataset:
    """A csv, tsv, jsonl or parquet file with a header, on local disk or in a bucket; ``columns`` maps
    the task's text fields and ``label`` to the file's column names where they differ. A
    ``labelled`` split (not a test split) must have the label column."""
    path = paths.own_file(name)
    if path is not None:
        return _from_local_file(task, path, columns, labelled=labelled)
    try:
        path = remote.local_copy(name)
    except DataError as err:
        raise DataError(f"data.files: {err}") from None
    with remote.named_as(name, path):
        return _from_local_file(task, path, columns, labelled=labelled)


def _from_local_file(task: TaskConfig, path: Path, columns: Dict[str, str], *, labelled: bool) -> datasets.Dataset:
    """The file's examples; a test split's (the one split ``labelled`` false) numbered by its own ids
    (:func:`_id_column`)."""
    ds = _read_file(path)
    wanted = {field: columns.get(field, field) for field in [*task.text_fields, *task.groups, "label"]}
    missing = [field for field, column in wanted.items()
               if column not in ds.column_names and (field != "label" or labelled)]
    if missing:
        named = ", ".join(f"{wanted[field]} (for {field})" for field in missing)
        raise DataError(f"{path} has no column {named}; its columns are {ds.column_names}. " +
                        (_other_separator(path, ds.column_names) or _no_header(path, task, ds.column_names, wanted) or
                         f"Map them with data.columns, e.g. +data.columns.{missing[0]}=<column>"))
    lookup = label_lookup(task)
    has_labels = wanted["label"] in ds.column_names
    # A file that keeps its labels' names beside their ids (a Parquet file saved by `datasets`, its ClassLabel):
    # each id is read as its name, whose id the task gives. Taken as the task's ids, they were shifted unsaid where
    # the file's order was another (class_encode_column sorts the names).
    names = _class_names(ds.features[wanted["label"]]) if has_labels else None
    ids = None if labelled else _id_column(ds, path)
    as_text = ids is not None and not _integers(ds.features[ids])

    def file_label(value: Any, where: str) -> float | int:
        if labelled:
            return parse_label(_named(value, names), task, lookup, where)
        # A test split's labels are not read for anything: an empty one (a column kept for labels to come, a JSON
        # null) is no label, as -1 is; it was refused as a gold label missing, and predicting stopped on it.
        if _empty(value):
            return NO_LABEL
        try:
            return parse_label(_named(value, names), task, lookup, where)
        except DataError as err:
            raise DataError(f"{err}. A test split needs no labels: leave its label column empty, or drop it") from None

    def convert(row: Dict[str, Any], i: int) -> Dict[str, Any]:
        for field in task.text_fields:  # a JSON null, a number: the tokenizer's TypeError named no file or row
            if not isinstance(row[wanted[field]], str):
                raise DataError(f"{path}, row {i + 1}: '{wanted[field]}' (for {field}) is {row[wanted[field]]!r}, not "
                                "text: give every row its text")
        label = file_label(row[wanted["label"]], f"{path}, row {i + 1}") if has_labels else NO_LABEL
        idx = i if ids is None else str(row[ids]) if as_text else int(row[ids])
        return {**{field: row[wanted[field]] for field in [*task.text_fields, *task.groups]}, "label": label,
                "idx": idx}

    return ds.map(convert, with_indices=True, remove_columns=ds.column_names,
                  features=_features(task, text_ids=as_text), desc=f"read {path.name}")


def _no_header(path: Path, task: TaskConfig, columns: List[str], wanted: Dict[str, str]) -> Optional[str]:
    """The fix for a CSV or TSV without a header line, whose first example was read as the columns' names: said
    where one of those names is a label of the task. The message said to map the columns with data.columns, to the
    names of a first example's texts."""
    if path.suffix not in _OWN_SEPARATOR or task.is_regression:
        return None
    lookup = label_lookup(task)
    label = next((column for column in columns if column.strip() in lookup), None)
    if label is None:
        return None
    return (f"Its first line holds an example, not a header: {label!r} is a label of task {task.name}. Add a header "
            f"line naming the columns ({', '.join(wanted.values())}), separated by "
            f"{_SEPARATORS[_OWN_SEPARATOR[path.suffix]]}")


# The characters a CSV or TSV may have been written with instead of its own separator, as the messages name them.
_SEPARATORS = {",": "commas", "\t": "tabs", ";": "semicolons", "|": "pipes"}
_OWN_SEPARATOR = {".csv": ",", ".tsv": "\t"}


def _other_separator(path: Path, columns: List[str]) -> Optional[str]:
    """The fix for a CSV or TSV whose header read as one column, its fields separated by another character (Excel
    writes semicolons where a comma is the decimal mark): the message said to map the columns with data.columns,
    and there was one to map."""
    own = _OWN_SEPARATOR.get(path.suffix)
    found = next((sep for sep in _SEPARATORS if sep != own and sep in columns[0]), None) if len(columns) == 1 else None
    if own is None or found is None:
        return None
    other = next((suffix for suffix, sep in _OWN_SEPARATOR.items() if sep == found), None)
    fix = f"name it {other}" if other else "save it with commas as a .csv, or with tabs as a .tsv"
    return f"Its fields are separated by {_SEPARATORS[found]}, where a {path.suffix} file's are by " \
        f"{_SEPARATORS[own]}: {fix}"


def _named(value: Any, names: Optional[List[str]]) -> Any:
    """A class id as its name, where the file keeps its labels' ``names``; any other value as it is."""
    if names is not None and isinstance(value, int) and 0 <= value < len(names):
        return names[value]
    return value


def _class_names(feature: Any) -> Optional[List[str]]:
    """The label names a column of class ids carries (``datasets``' ClassLabel), in id order; None for any other."""
    return list(feature.names) if isinstance(feature, datasets.ClassLabel) else None


def _aligned_labels(ds: datasets.Dataset, task: TaskConfig, source: str) -> datasets.Dataset:
    """A Hub split's class ids as the task's: its ClassLabel's names in another order are mapped to the task's ids
    (-1, no label, stays); names the task does not have are refused, naming both."""
    names = _class_names(ds.features["label"])
    if names is None or names == list(task.label_names):
        return ds
    ours = {name.lower(): i for i, name in enumerate(task.label_names)}
    if sorted(name.lower() for name in names) != sorted(ours):
        raise DataError(f"{source} names its labels {names}, and task={task.name} has label_names "
                        f"{list(task.label_names)}: set task.label_names to the dataset's names, in the order of the "
                        "ids the model should give them")
    log.info("%s names its labels %s: mapped to task=%s's ids, %s", source, names, task.name, list(task.label_names))
    to_ours = [ours[name.lower()] for name in names]
    features = ds.features.copy()
    features["label"] = datasets.ClassLabel(names=list(task.label_names))
    return ds.map(lambda labels: {"label": [to_ours[label] if label >= 0 else label for label in labels]},
                  input_columns="label", batched=True, features=features, desc=f"{task.name}: the task's label ids")


def _integers(feature: Any) -> bool:
    """Whether a column holds whole numbers (ids kept as numbers; any other ids are kept as text)."""
    return isinstance(feature, datasets.Value) and feature.dtype.startswith(("int", "uint"))


def _id_column(ds: datasets.Dataset, path: Path) -> Optional[str]:
    """The column of a test file's own ids, which its predictions keep: the first of ID_COLUMNS it has,
    each row's id there and no two the same (else a DataError naming the file and the row). None where
    it has none: its rows are numbered 0 to n-1, as the log says."""
    column = next((name for name in ID_COLUMNS if name in ds.column_names), None)
    if column is None:
        log.info("%s has no %s column: its predictions number its rows 0 to %d", path,
                 ", ".join(ID_COLUMNS[:-1]) + f" or {ID_COLUMNS[-1]}", len(ds) - 1)
        return None
    if isinstance(ds.features[column], datasets.Value) and ds.features[column].dtype.startswith("float"):
        raise _decimal_ids(ds[column], column, path)
    seen: Dict[str, int] = {}
    for row, value in enumerate(ds[column], start=1):
        if value is None or (isinstance(value, str) and not value.strip()):
            raise DataError(f"{path}, row {row}: no id in its '{column}' column. A test file's ids number its "
                            "predictions: give every row one, or drop the column to number the rows 0 to n-1")
        if str(value) in seen:
            raise DataError(f"{path}: the id {value!r} (column '{column}') is on rows {seen[str(value)]} and {row}. "
                            "A test file's ids number its predictions, each its own: make them unique, or drop the "
                            "column to number the rows 0 to n-1")
        seen[str(value)] = row
    return column


def _decimal_ids(values: List[Any], column: str, path: Path) -> DataError:
    """Ids read as decimal numbers (a JSON or Parquet file's): one JSON id over 2**63 - 1 turns the whole column to
    floats, and the predictions named every example so (5.0), that one with digits lost (1.2345678901234567e+19).
    The row to blame: the first id that is no whole number of 64 bits, else the first."""
    row = next((i for i, value in enumerate(values, start=1)
                if value is not None and not (float(value).is_integer() and abs(value) < 2**63)), 1)
    return DataError(f"{path}, row {row}: the id {values[row - 1]!r} (column '{column}') was read as a decimal number, "
                     "and with it every id of the column: a test file's ids name its predictions. Write them as text "
                     '("12345678901234567890") or as whole numbers below 2**63')


def _read_file(path: Path) -> datasets.Dataset:
    """The file as its ``datasets`` builder reads it, cached by path, size and mtime. A file the
    builder cannot read, or one with no rows, is a DataError naming the file (and the line, where
    one is to blame), and leaves nothing in the cache for a later run to take."""
    stat = path.stat()
    if stat.st_size == 0:
        raise DataError(_no_examples(path, "it is empty"))
    builder_name, options = FILE_FORMATS[path.suffix]
    if builder_name == "csv":
        options = {**options, "converters": _as_text(path, options)}
    # The config name joins the cache key: `datasets` keys local files by their mtime but not their size.
    builder = datasets.load_dataset_builder(builder_name, name=f"{stat.st_size}-{stat.st_mtime_ns}",
                                            data_files=str(path.resolve()), **options)
    try:
        with _quiet_builders(), _parser_warnings() as said:
            builder.download_and_prepare()
        # pandas leaves out the fields past the header's of a first row that has more, with a warning alone
        bad = _first_ragged_row(path, "") if said else None
        if bad is not None:
            raise DataError(f"{path}, line {bad[0]}: {bad[1]}")
        split = (builder.info.splits or {}).get("train")
        if split is None or not split.num_examples:
            raise DataError(_no_examples(path, _EMPTY_AS[path.suffix]))
        return builder.as_dataset(split="train")
    except (DatasetGenerationError, ValueError) as err:  # ValueError: pyarrow's ArrowInvalid, and DataError
        shutil.rmtree(builder.cache_dir, ignore_errors=True)
        if isinstance(err, DataError):
            raise
        raise DataError(_unreadable(path, err)) from None


def _as_text(path: Path, options: Dict[str, Any]) -> Dict[int, Any]:
    """pandas' converters that keep each of a CSV's or TSV's columns, by position, as the text it holds. Left to guess
    a type, pandas made a column of numbers or of True/False numbers and booleans, which a text field refused as not
    text (a sentence "1.10" shown as 1.1), and made ids of 0007 the id 7.0, 1.1 and 1.10 one id, a 20-digit id an
    overflow. Labels and scores are read from their text (parse_label)."""
    with open(path, encoding="utf-8-sig", errors="replace", newline="") as f:  # the builder names bytes not UTF-8
        header = next(csv.reader(f, delimiter=options.get("sep", ","),
                                 quoting=options.get("quoting", csv.QUOTE_MINIMAL)), [])
    return {column: str for column in range(len(header))}


@contextmanager
def _parser_warnings() -> Iterator[List[warnings.WarningMessage]]:
    """pandas' ParserWarnings while a CSV or TSV is read, kept to look into; any other warning is given as ever."""
    said: List[warnings.WarningMessage] = []
    caught: List[warnings.WarningMessage] = []
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ParserWarning)
            yield said
    finally:
        for each in caught:
            if issubclass(each.category, ParserWarning):
                said.append(each)
            else:
                warnings.warn_explicit(each.message, each.category, each.filename, each.lineno)


@contextmanager
def _quiet_builders() -> Iterator[None]:
    """The builders log their reader's error before raising it; the DataError says it once, with the line."""
    logger = logging.getLogger("datasets.packaged_modules")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def _unreadable(path: Path, err: Exception) -> str:
    """What the builder could not read in ``path``: the line at fault where there is one to find."""
    fmt = FORMAT_NAMES[path.suffix]
    bad = None if path.suffix == ".parquet" else _first_bad_line(path, json_lines=path.suffix == ".jsonl")
    if bad is None and path.suffix in (".csv", ".tsv"):
        bad = _first_ragged_row(path, str(err.__cause__ or err))
    if bad is not None:
        return f"{path}, line {bad[0]}: {bad[1]}"
    cause = err.__cause__ or err  # DatasetGenerationError wraps the reader's own error
    formats = ", ".join(FORMAT_NAMES.values())
    return (f"{path} cannot be read as {fmt}: {str(cause).strip().rstrip('.')}. data.files takes {formats} files, "
            "named by their extension")


# ------------------------------------------------------------------------ GLUE's diagnostic set


def diagnostic(task: TaskConfig, data: DataConfig) -> Tuple[Optional[datasets.Dataset], str]:
    """GLUE's diagnostic set (task.diagnostic), unlabelled, from where the task's data comes: ``data.dir``'s
    ``diagnostic/diagnostic.tsv``, or the Hub's ``ax`` config. None, and why, where it is not there:
    a run predicts the test splits without it (files of your own have none)."""
    ax = task.diagnostic
    assert ax is not None
    if data.files:
        return None, "data.files names no diagnostic set"
    if data.dir is not None:
        assert task.glue is not None  # the config checked it
        url = f"{data.dir.rstrip('/')}/{ax.glue_file}"
        if remote.is_remote(data.dir):
            if not remote.exists(url):
                return None, f"{url} does not exist: put GLUE's diagnostic.tsv there, as its download does"
            path = remote.local_copy(url)
            with remote.named_as(url, path):
                return _read_glue_file(task, task.glue, path, DIAGNOSTIC_SPLIT, labelled=False), ""
        path = Path(data.dir).expanduser() / ax.glue_file
        if not path.is_file():
            return None, f"{path} does not exist: put GLUE's diagnostic.tsv there, as its download does"
        return _read_glue_file(task, task.glue, path, DIAGNOSTIC_SPLIT, labelled=False), ""
    try:
        found = _from_hub(dataclasses.replace(task, hub_config=ax.hub_config, hub_data_dir=None), [ax.hub_split])
    except (UserError, ValueError) as err:  # datasets' ValueError: a copy without that config; no network
        return None, str(err)
    return found[ax.hub_split], ""


# ------------------------------------------------------------------------------- Hub, synthetic


def _from_hub(task: TaskConfig, splits: List[str], dir_key: str = "data.dir") -> Dict[str, datasets.Dataset]:
    assert task.hub_dataset is not None
    if os.path.isdir(task.hub_dataset):  # a local copy of the dataset's Hub repository (of its revision)
        raw = datasets.load_dataset(task.hub_dataset, task.hub_config, data_dir=task.hub_data_dir)
    else:
        config = f" ({task.hub_config})" if task.hub_config else ""
        with hub_download(f"dataset '{task.hub_dataset}'{config}", dataset=True,
                          offline=_offline_hint(task, splits, dir_key)):
            raw = datasets.load_dataset(task.hub_dataset, task.hub_config, data_dir=task.hub_data_dir,
                                        revision=task.hub_revision)
    missing = [split for split in splits if split not in raw]
    if missing:
        raise DataError(f"dataset '{task.hub_dataset}' ({task.hub_config}) has no split {missing}; "
                        f"it has {list(raw)}")
    columns = [*task.text_fields, "label", *task.groups]
    absent = [column for column in columns if column not in raw[splits[0]].column_names] if splits else []
    if absent:
        raise DataError(f"dataset '{task.hub_dataset}' ({task.hub_config}) has no column {absent}; it has "
                        f"{raw[splits[0]].column_names}: check task.hub_dataset, hub_revision and hub_data_dir")
    source = f"dataset '{task.hub_dataset}' ({task.hub_config})"
    return {split: _aligned_labels(_with_idx(raw[split]).select_columns([*columns, "idx"]), task, source)
            for split in splits}


def _offline_hint(task: TaskConfig, splits: List[str], dir_key: str) -> Optional[str]:
    """The way to run offline, for an eval.extra set: it is read from eval.dir, where the general advice (None) names
    data.dir, which the run's own task reads."""
    if dir_key != "eval.dir" or task.glue is None:
        return None
    files = ", ".join(sorted({task.glue.files[split] for split in splits}))
    return (f"To run offline: set eval.dir to a folder holding {task.name}'s original download ({task.glue.folder}/ "
            f"with {files}), load it from the Hugging Face cache with HF_HUB_OFFLINE=1 where a run downloaded it, or "
            f"leave {task.name} out of eval.extra.")


def _with_idx(ds: datasets.Dataset) -> datasets.Dataset:
    return ds if "idx" in ds.column_names else ds.add_column("idx", list(range(len(ds))))


def _synthetic(data: DataConfig, split: str) -> datasets.Dataset:
    if split not in SYNTHETIC_SEEDS:
        raise DataError(f"the synthetic task has the splits {list(SYNTHETIC_SEEDS)}, not {split}")
    size = data.synthetic_train_size if split == "train" else data.synthetic_eval_size
    rows = synthetic.generate(size, seed=SYNTHETIC_SEEDS[split], version=data.synthetic_version)
    return _with_idx(datasets.Dataset.from_dict(rows))
