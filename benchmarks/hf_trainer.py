"""The baseline: fine-tuning with the Hugging Face Trainer, set up as transformers' ``run_glue.py``
sets it up, on GLUE-layout tsv files, saving the model at the end as run_glue.py does; prints one
JSON line with its throughput (training, and the dev set's prediction), peak memory and accuracy.
``python -m benchmarks.vs_trainer`` runs it beside train.py; it also runs alone, from the repository root:

    python -m benchmarks.hf_trainer --model DIR --train RTE/train.tsv --dev RTE/dev.tsv \\
        --columns sentence1 sentence2 label --labels entailment not_entailment --steps 100 [--tuned]
    python -m benchmarks.hf_trainer --model DIR --train SST-2/train.tsv --dev SST-2/dev.tsv \\
        --columns sentence label --labels 0 1 --precision bf16 --tuned

Default: ``run_glue.py``'s defaults, every example padded to ``--max-seq-length``. ``--tuned``: its
``--pad_to_max_length False`` (dynamic padding, to a multiple of 8 in fp16 or bf16) with
``--group_by_length`` (batches of about one length). ``--tf32``: TF32 matmuls on an Ampere or newer GPU
(``TrainingArguments(tf32=True)``), as train.py computes by default; ``vs_trainer`` passes it where ours has it.
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Dict, List, Optional, Tuple

import numpy as np
import torch
from datasets import Dataset, load_dataset
from sklearn.metrics import accuracy_score
from transformers import (
    AutoModelForSequenceClassification,
    AutoTokenizer,
    DataCollatorWithPadding,
    Trainer,
    TrainingArguments,
    default_data_collator,
)
from transformers.utils import logging as hf_logging


def read_tsv(path: Path, columns: List[str], labels: List[str]) -> Dataset:
    """A GLUE tsv (no quoting, as GLUE writes them) with its label names turned into ids: column ``a``,
    ``b`` for a sentence pair, and ``label``."""
    *texts, label = columns
    ds = load_dataset("csv", data_files=str(path), delimiter="\t", quoting=3, keep_default_na=False)["train"]
    ids = ds.map(lambda row: {**{name: str(row[text]) for name, text in zip("ab", texts)},
                              "label_id": labels.index(str(row[label]))}, remove_columns=ds.column_names)
    return ids.rename_column("label_id", "label")


def accuracy(trainer: Trainer, ds: Optional[Dataset]) -> Tuple[Optional[float], Optional[float]]:
    """The accuracy on ``ds``, and the examples per second of its prediction."""
    if ds is None:
        return None, None
    start = time.perf_counter()
    out = trainer.predict(ds)
    speed = len(ds) / (time.perf_counter() - start)
    return float(accuracy_score(out.label_ids, np.argmax(out.predictions, axis=-1))), speed


def tf32_available() -> bool:
    """An Ampere or newer GPU: TrainingArguments(tf32=True) refuses to start anywhere else."""
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 8


def run(args: argparse.Namespace) -> Dict[str, Optional[float]]:
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=len(args.labels))
    padding = False if args.tuned else "max_length"

    def tokenize(path: Optional[Path]) -> Optional[Dataset]:
        if path is None:
            return None
        texts = ["a", "b"][:len(args.columns) - 1]
        return read_tsv(path, args.columns, args.labels).map(
            lambda rows: tokenizer(*(rows[text] for text in texts), padding=padding, max_length=args.max_seq_length,
                                   truncation=True), batched=True, remove_columns=texts)

    train, dev, test = tokenize(args.train), tokenize(args.dev), tokenize(args.test)
    cuda = torch.cuda.is_available()
    # run_glue.py pads to a multiple of 8 in fp16 only; bf16 gains from it as much.
    collator = (DataCollatorWithPadding(tokenizer, pad_to_multiple_of=None if args.precision == "fp32" else 8)
                if args.tuned else default_data_collator)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
            learning_rate=args.lr, max_steps=args.steps, seed=args.seed, eval_strategy="no", save_strategy="no",
            report_to="none", disable_tqdm=True, use_cpu=not cuda, bf16=args.precision == "bf16",
            fp16=args.precision == "fp16", tf32=True if args.tf32 and tf32_available() else None,
            include_num_input_tokens_seen="non_padding",
            train_sampling_strategy="group_by_length" if args.tuned else "random")
        trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=collator,
                          processing_class=tokenizer)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        (dev_accuracy, eval_speed), (test_accuracy, _) = accuracy(trainer, dev), accuracy(trainer, test)
        trainer.save_model(out)  # as run_glue.py ends: the whole run's wall time includes saving, as ours does
    return {"examples_per_second": args.steps * args.batch_size / seconds,
            "tokens_per_second": trainer.state.num_input_tokens_seen / seconds, "train_seconds": seconds,
            "eval_examples_per_second": eval_speed, "peak_memory_bytes": peak, "dev_accuracy": dev_accuracy,
            "test_accuracy": test_accuracy, "precision": args.precision}


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.hf_trainer", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="a checkpoint directory (model and tokenizer)")
    parser.add_argument("--train", type=Path, required=True)
    parser.add_argument("--dev", type=Path, help="scored after training")
    parser.add_argument("--test", type=Path, help="a labelled test file, scored after training")
    parser.add_argument("--columns", nargs="+", default=["sentence1", "sentence2", "label"],
                        help="the text column (or two, for sentence pairs), then the label column")
    parser.add_argument("--labels", nargs="+", required=True, help="label names, in the model's id order")
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--tuned", action="store_true", help="dynamic padding and length-grouped batches")
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls where the GPU has them (Ampere and "
                        "newer), as train.py's precision.tf32 defaults to; elsewhere ignored")
    args = parser.parse_args()
    if len(args.columns) not in (2, 3):
        parser.error(f"--columns {' '.join(args.columns)}: give one or two text columns, then the label column")
    hf_logging.set_verbosity_error()
    print(json.dumps(run(args)))


if __name__ == "__main__":
    main()
