"""Benchmark data of SST-2's shape where GLUE's SST-2 is not at hand: real English sentences from the
repository's RTE files, one per example, in SST-2's layout (``train.tsv`` and ``dev.tsv``: sentence
and a 0/1 label; ``test.tsv``: index and sentence), so that ``task=sst2`` reads them as it reads GLUE's.

Training sentences are RTE's hypotheses (train, then test: 2,628; mean about 9 words, as SST-2's
training phrases); dev sentences are the first sentence of each RTE dev and test premise, the first
872 as in SST-2's dev set (mean about 26 words; SST-2's dev sentences about 19). Only the lengths are
SST-2's: the label is the RTE pair's (entailment 1, else 0), which the sentence alone barely
predicts, so accuracies on these files say nothing; speed does. From the repository root:

    python -m benchmarks.sst2_like OUT            # OUT/SST-2/{train,dev,test}.tsv: task=sst2 data.dir=OUT
"""

from __future__ import annotations

import argparse
import csv
import re
from pathlib import Path
from typing import List, Tuple

ROOT = Path(__file__).resolve().parent.parent
RTE = ROOT / "tests" / "data" / "glue_data" / "RTE"
DEV_SIZE = 872  # SST-2's dev set
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")


def _rows(path: Path) -> List[dict]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def _label(row: dict) -> str:
    return "1" if row["label"] == "entailment" else "0"


def examples(rte: Path = RTE) -> Tuple[List[Tuple[str, str]], List[Tuple[str, str]]]:
    """(sentence, label) for training and for dev, in file order."""
    pairs = _rows(rte / "train.tsv") + _rows(rte / "test.tsv")
    train = [(row["sentence2"], _label(row)) for row in pairs]
    premises = _rows(rte / "dev.tsv") + _rows(rte / "test.tsv")
    dev = [(_SENTENCE_END.split(row["sentence1"])[0], _label(row)) for row in premises][:DEV_SIZE]
    return train, dev


def write(folder: Path, rte: Path = RTE) -> Path:
    """``folder/SST-2/``'s three files; returns ``folder/SST-2``."""
    train, dev = examples(rte)
    out = folder / "SST-2"
    out.mkdir(parents=True, exist_ok=True)
    for name, rows in (("train", train), ("dev", dev)):
        with open(out / f"{name}.tsv", "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar="\\")
            writer.writerow(["sentence", "label"])
            writer.writerows(rows)
    with open(out / "test.tsv", "w", newline="") as f:
        writer = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE, escapechar="\\")
        writer.writerow(["index", "sentence"])
        writer.writerows((index, sentence) for index, (sentence, _) in enumerate(dev))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.sst2_like", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="writes OUT/SST-2/{train,dev,test}.tsv")
    args = parser.parse_args()
    folder = write(args.out)
    print(f"written: {folder} (task=sst2 data.dir={args.out})")


if __name__ == "__main__":
    main()
