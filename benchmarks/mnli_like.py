"""Benchmark data for when there is no pretrained checkpoint: sentence pairs whose lengths follow
MNLI's (RoBERTa tokens per premise + hypothesis pair: mean about 40, a long tail past 128), in
GLUE's RTE layout, and a model with random weights whose tokenizer reads each word as one token.

Only the lengths are MNLI's: the words are made up, and the label (does the hypothesis's first word
occur in the premise?) is there so that the loss has something to fall on.
``python -m benchmarks.vs_trainer --synthetic`` writes them for itself; to write them alone, from
the repository root:

    python -m benchmarks.mnli_like OUT --arch roberta-large   # OUT/glue/RTE/*.tsv and OUT/model
"""

from __future__ import annotations

import argparse
import csv
import math
import random
from pathlib import Path
from typing import Dict, List

from transformers import AutoConfig, AutoModelForSequenceClassification

from benchmarks.architectures import HUB, WIDTHS, widths
from nli.model.build import train_bpe_tokenizer

LABELS = ["entailment", "not_entailment"]
WORDS = 3000  # the made-up vocabulary
VOCABULARY = 16000  # BPE tokens: room for every word, with and without its leading space, whole
# Words per sentence: log-normal, median and spread fitted to MNLI's premises and hypotheses.
PREMISE = (20.0, 0.62)
HYPOTHESIS = (10.0, 0.5)

# RoBERTa's widths (benchmarks.architectures), and a tiny one: hidden size, layers, heads, feed-forward width.
ARCHITECTURES: Dict[str, Dict[str, int]] = {
    **{name: {key: HUB[f"FacebookAI/{name}"][key] for key in WIDTHS}
       for name in ("roberta-large", "roberta-base")},
    "tiny": widths(64, 2, 2, 128),
}


def _sentence(rng: random.Random, vocabulary: List[str], median_sigma: tuple) -> List[str]:
    median, sigma = median_sigma
    return rng.choices(vocabulary, k=max(1, round(rng.lognormvariate(math.log(median), sigma))))


def write_glue_folder(folder: Path, *, train: int, dev: int, seed: int = 0) -> List[str]:
    """train.tsv, dev.tsv and a labelled test.tsv (the size of dev) in ``folder``; returns the
    training texts (for a tokenizer)."""
    rng = random.Random(seed)
    vocabulary = sorted({"".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(3, 8)))
                         for _ in range(WORDS * 2)})[:WORDS]
    folder.mkdir(parents=True, exist_ok=True)
    texts = []
    for split, size in (("train", train), ("dev", dev), ("test", dev)):
        with open(folder / f"{split}.tsv", "w", newline="") as f:
            writer = csv.writer(f, delimiter="\t", lineterminator="\n", quoting=csv.QUOTE_NONE)
            writer.writerow(["index", "sentence1", "sentence2", "label"])
            for index in range(size):
                premise, hypothesis = _sentence(rng, vocabulary, PREMISE), _sentence(rng, vocabulary, HYPOTHESIS)
                if rng.random() < 0.5:
                    hypothesis[0] = rng.choice(premise)
                label = LABELS[0] if hypothesis[0] in premise else LABELS[1]
                writer.writerow([index, " ".join(premise), " ".join(hypothesis), label])
                if split == "train":
                    texts += [" ".join(premise), " ".join(hypothesis)]
    return texts


def write_random_model(directory: Path, *, architecture: str, texts: List[str], max_seq_length: int,
                       seed: int = 0) -> None:
    """A RoBERTa of ``architecture`` with random weights and a BPE tokenizer learnt from ``texts``,
    saved as a checkpoint that train.py and the Trainer load alike."""
    import torch

    tokenizer = train_bpe_tokenizer(texts, vocab_size=VOCABULARY, max_seq_length=max_seq_length)
    config = AutoConfig.for_model("roberta", vocab_size=len(tokenizer), max_position_embeddings=max_seq_length + 2,
                                  type_vocab_size=1, pad_token_id=tokenizer.pad_token_id,
                                  bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                                  num_labels=len(LABELS), **ARCHITECTURES[architecture])
    torch.manual_seed(seed)
    AutoModelForSequenceClassification.from_config(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mnli_like", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path, help="writes OUT/glue/RTE/{train,dev,test}.tsv and the checkpoint OUT/model")
    parser.add_argument("--arch", default="roberta-large", choices=list(ARCHITECTURES))
    parser.add_argument("--train", type=int, default=4096,
                        help="training pairs (dev and test: an eighth as many each, at least 64)")
    parser.add_argument("--seq-len", type=int, default=128, help="the model's maximum length")
    parser.add_argument("--seed", type=int, default=42)
    args = parser.parse_args()
    texts = write_glue_folder(args.out / "glue" / "RTE", train=args.train, dev=max(args.train // 8, 64), seed=args.seed)
    write_random_model(args.out / "model", architecture=args.arch, texts=texts, max_seq_length=args.seq_len,
                       seed=args.seed)
    print(f"written: {args.out / 'glue' / 'RTE'} (task=rte data.dir={args.out / 'glue'}) and {args.out / 'model'}")


if __name__ == "__main__":
    main()
