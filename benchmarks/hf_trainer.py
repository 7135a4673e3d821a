"""The baseline: fine-tuning with the Hugging Face Trainer, set up as transformers' run_glue.py sets
it up, on local GLUE files; prints one JSON line with its throughput, memory and test accuracy.

    python benchmarks/hf_trainer.py --model PATH --task-dir glue_data/RTE --steps 100 [--tuned]

Default: run_glue.py's defaults, every example padded to --max-seq-length. --tuned: dynamic
padding (to a multiple of 8, as run_glue.py does in fp16) and length-grouped batches.
(Work in progress for the throughput benchmark: the driver that alternates it with train.py and
prints the table is still to come.)
"""

from __future__ import annotations

import argparse
import json
import resource
import tempfile
import time
from pathlib import Path
from typing import Dict

import numpy as np
import torch
from datasets import Dataset, load_dataset
from sklearn.metrics import accuracy_score
from transformers import (AutoModelForSequenceClassification, AutoTokenizer, DataCollatorWithPadding, Trainer,
                          TrainingArguments, default_data_collator)

LABELS = ["entailment", "not_entailment"]  # RTE's, in the Hub dataset's ClassLabel order


def read_split(task_dir: Path, split: str) -> Dataset:
    ds = load_dataset("csv", data_files=str(task_dir / f"{split}.tsv"), delimiter="\t", quoting=3)["train"]
    ids = ds.map(lambda row: {"label_id": LABELS.index(row["label"])}, remove_columns=["label"])
    return ids.rename_column("label_id", "label")


def run(args: argparse.Namespace) -> Dict[str, float]:
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    model = AutoModelForSequenceClassification.from_pretrained(args.model, num_labels=len(LABELS))
    padding = False if args.tuned else "max_length"

    def preprocess(rows: Dict) -> Dict:
        return tokenizer(rows["sentence1"], rows["sentence2"], padding=padding, max_length=args.max_seq_length,
                         truncation=True)

    columns = ["index", "sentence1", "sentence2"]
    train, test = (read_split(args.task_dir, s).map(preprocess, batched=True, remove_columns=columns)
                   for s in ("train", "test"))
    cuda = torch.cuda.is_available()
    collator = (DataCollatorWithPadding(tokenizer, pad_to_multiple_of=8 if args.precision != "fp32" else None)
                if args.tuned else default_data_collator)
    with tempfile.TemporaryDirectory() as out:
        training = TrainingArguments(
            output_dir=out, per_device_train_batch_size=args.batch_size, per_device_eval_batch_size=128,
            learning_rate=args.lr, max_steps=args.steps, seed=args.seed, eval_strategy="no", save_strategy="no",
            report_to="none", disable_tqdm=True, use_cpu=not cuda, bf16=args.precision == "bf16",
            fp16=args.precision == "fp16", include_num_input_tokens_seen="non_padding",
            train_sampling_strategy="group_by_length" if args.tuned else "random")
        trainer = Trainer(model=model, args=training, train_dataset=train, data_collator=collator,
                          processing_class=tokenizer)
        start = time.perf_counter()
        metrics = trainer.train().metrics
        seconds = time.perf_counter() - start
        predictions = trainer.predict(test)
    accuracy = accuracy_score(predictions.label_ids, np.argmax(predictions.predictions, axis=-1))
    peak = torch.cuda.max_memory_allocated() if cuda else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return {"examples_per_second": args.steps * args.batch_size / seconds,
            "tokens_per_second": trainer.state.num_input_tokens_seen / seconds,
            "trainer_samples_per_second": metrics["train_samples_per_second"],
            "train_seconds": seconds, "peak_memory_bytes": peak, "test_accuracy": float(accuracy)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--task-dir", type=Path, required=True)
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--max-seq-length", type=int, default=128)
    parser.add_argument("--precision", choices=["fp32", "bf16", "fp16"], default="fp32")
    parser.add_argument("--tuned", action="store_true")
    print(json.dumps(run(parser.parse_args())))


if __name__ == "__main__":
    main()
