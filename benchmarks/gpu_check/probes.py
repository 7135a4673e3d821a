"""The GPU check's probes: an fp16-stored checkpoint, host synchronisations per step, SDPA's kernels, a checkpoint's
GPU generator."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
from typing import Dict, List

from benchmarks.gpu_check import ROOT
from benchmarks.gpu_check.subruns import Check, Line, Skipped, child, require, sub_run, train


def line_fp16_checkpoint(check: Check, line: Line) -> None:
    """A checkpoint stored in fp16, trained in bf16 and fp16: no crash, float32 exported weights."""
    source = check.work / "runs" / "fp16-checkpoint-source"
    sub_run(check, line, "make", [sys.executable, "-m", "benchmarks.gpu_check", "make-fp16-checkpoint", str(source)],
            timeout=120)
    for precision in ("bf16", "fp16"):
        if precision == "fp16" and not check.gpu:
            line.figures["fp16"] = "skipped: no GPU"
            continue
        proc = train(check, line, precision, ["task=rte", f"data.dir={source / 'glue'}",
                                              f"model.name_or_path={source / 'model'}", f"precision={precision}",
                                              "data.max_seq_length=128", "train.max_steps=20", "train.batch_size=32",
                                              "train.eval_every=20", "logger=none"])
        assert proc.results is not None and proc.folder is not None
        dtypes = stored_dtypes(proc.folder / "model" / "model.safetensors")
        line.figures[precision] = {"loss": proc.results["loss"], "exported_dtypes": dtypes}
        require(math.isfinite(proc.results["loss"]), f"{precision}: loss {proc.results['loss']} is not finite")
        require(dtypes == ["float32"], f"{precision}: exported weights are {dtypes}, not float32")
    line.detail = "each run completed with a finite loss and float32 exported weights"


def stored_dtypes(path: Path) -> List[str]:
    """The dtypes of a safetensors file's tensors, from its header (no torch needed)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
    names = {"F32": "float32", "F16": "float16", "BF16": "bfloat16", "F64": "float64"}
    return sorted({names.get(t["dtype"], t["dtype"]) for k, t in header.items() if k != "__metadata__"
                   and t["dtype"].startswith(("F", "BF"))})


def make_fp16_checkpoint(folder: Path) -> None:
    """A random tiny RoBERTa and its tokenizer saved in float16, with RTE-layout files to train it on."""
    import torch
    from transformers import AutoModelForSequenceClassification

    from benchmarks.mnli_like import write_glue_folder, write_random_model

    texts = write_glue_folder(folder / "glue" / "RTE", train=640, dev=64)
    write_random_model(folder / "model", architecture="tiny", texts=texts, max_seq_length=128)
    model = AutoModelForSequenceClassification.from_pretrained(folder / "model").to(torch.float16)
    model.save_pretrained(folder / "model")
    stored = stored_dtypes(folder / "model" / "model.safetensors")
    assert stored == ["float16"], stored


SYNC_STEPS = 20  # training steps between the two runs whose synchronisations are compared


SYNCS = "syncs.json"  # count-syncs' counts, in the folder it is given


def line_syncs(check: Check, line: Line) -> None:
    """How often the host waits for the GPU in a training step (torch.cuda.set_sync_debug_mode), and where: a run
    of 2N steps less one of N, so that set-up and evaluations cancel out. The loop itself should wait in none
    (non-finite steps are skipped on the device); transformers' SDPA mask check waits once per forward."""
    folder = check.work / "runs" / "syncs"
    sub_run(check, line, "count", [sys.executable, "-m", "benchmarks.gpu_check", "count-syncs", str(folder)],
            timeout=240)
    found = json.loads((folder / SYNCS).read_text())  # a file: on a GPU, lines follow the counts on stdout
    if not check.gpu:  # the rehearsal runs the counting and reads it back; a CPU has nothing to wait for
        raise Skipped("no GPU (counted and read back: a CPU has no synchronisation to count)")
    per_step = {where: round((found["long"].get(where, 0) - found["short"].get(where, 0)) / SYNC_STEPS, 2)
                for where in {**found["long"], **found["short"]}}
    per_step = {where: count for where, count in sorted(per_step.items(), key=lambda item: -item[1]) if count}
    line.figures.update(syncs_per_step=round(sum(per_step.values()), 2), by_source=per_step)
    ours = {where: count for where, count in per_step.items() if where.startswith("nli/")}
    require(not ours, f"the project's own code waits for the GPU at every step: {ours}")
    line.detail = "no synchronisation per step from nli/ (others, by source, in the figures)"


def count_syncs(folder: Path) -> None:
    """Two quickstart runs in this process, of SYNC_STEPS and 2 x SYNC_STEPS steps, evaluating and logging only at
    their end, with torch's synchronisation warnings counted by the file (under the repository or a package)
    that called the synchronising operation."""
    import warnings

    import torch

    from nli.config.command import compose
    from nli.recipe import run
    from nli.runtime.context import local

    counts: Dict[str, Dict[str, int]] = {}
    for name, steps in (("short", SYNC_STEPS), ("long", 2 * SYNC_STEPS)):
        cfg = compose(["experiment=quickstart", "hw=auto", "precision=bf16", f"train.max_steps={steps}",
                       f"train.eval_every={steps}", f"train.log_every={steps}", f"train.checkpoint_every={steps}",
                       "train.progress_bar=false", "logger=none", "train.resume=false"])
        gpu = torch.cuda.is_available()  # a rehearsal on the CPU counts nothing, and runs the rest
        if gpu:
            torch.cuda.set_sync_debug_mode("warn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            run(cfg, local(cfg, str(folder / name)))
        if gpu:
            torch.cuda.set_sync_debug_mode("default")
        sources: Dict[str, int] = {}
        for warning in caught:
            if "synchroniz" in str(warning.message):
                where = _source(warning.filename)
                sources[where] = sources.get(where, 0) + 1
        counts[name] = sources
    (folder / SYNCS).write_text(json.dumps(counts))


def _source(filename: str) -> str:
    """A file as the report names it: relative to the repository, else from its package's folder on."""
    path = Path(filename)
    if path.is_relative_to(ROOT):
        return str(path.relative_to(ROOT))
    parts = path.parts
    return "/".join(parts[parts.index("site-packages") + 1:]) if "site-packages" in parts else path.name


SDPA = r"""
import json, time, torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import AutoModelForSequenceClassification, RobertaConfig
config = RobertaConfig(hidden_size=1024, num_hidden_layers=4, num_attention_heads=16, intermediate_size=4096,
                       vocab_size=50265, max_position_embeddings=514)
model = AutoModelForSequenceClassification.from_config(config, attn_implementation="sdpa").cuda()
ids = torch.randint(5, 50000, (32, 128), device="cuda")
padded = torch.ones_like(ids)
for row, length in enumerate(torch.randint(40, 128, (32,)).tolist()):
    padded[row, length:] = 0
full = torch.ones_like(ids)
out = {}
def step(mask, backends):
    with sdpa_kernel(backends), torch.autocast("cuda", dtype=torch.bfloat16):
        model(input_ids=ids, attention_mask=mask).logits.float().sum().backward()
for name, mask in (("padded", padded), ("unpadded", full)):
    for kernel in ("FLASH_ATTENTION", "EFFICIENT_ATTENTION"):
        try:
            step(mask, [getattr(SDPBackend, kernel)])
            torch.cuda.synchronize()
            start = time.perf_counter()
            for _ in range(10):
                step(mask, [getattr(SDPBackend, kernel)])
            torch.cuda.synchronize()
            out[f"{name}_{kernel.lower()}_ms"] = round((time.perf_counter() - start) * 100, 2)
        except RuntimeError as error:
            out[f"{name}_{kernel.lower()}_ms"] = "refused: " + str(error).splitlines()[0][:120]
print(json.dumps(out))
"""


def line_sdpa(check: Check, line: Line) -> None:
    """Which of SDPA's kernels can run a batch with padding: transformers hands SDPA a boolean padding mask, which
    flash attention does not take (the memory-efficient kernel runs instead); a batch without padding gets no mask.
    Four roberta-large layers, forward and backward in bf16, each kernel alone, timed."""
    if not check.gpu:
        raise Skipped("no GPU")
    line.figures.update(json.loads(child(check, SDPA)))
    line.detail = "measured: the kernels each batch can use, and their time (10 forward and backward passes)"


RNG = r"""
import torch
from nli.train.checkpoint import restore_rng, rng_state
state = rng_state()
assert isinstance(state["cuda"], torch.Tensor), type(state["cuda"])
expected = torch.rand(4, device="cuda")
restore_rng(state)
assert torch.equal(torch.rand(4, device="cuda"), expected), "this GPU's generator did not come back"
state["cuda"] = [state["cuda"]] * 8  # an earlier version's checkpoint, written seeing eight GPUs
restore_rng(state)
assert torch.equal(torch.rand(4, device="cuda"), expected), "this GPU's generator from an eight-GPU list"
print("restored")
"""


def line_rng(check: Check, line: Line) -> None:
    """A checkpoint's GPU generator restored on one GPU: its own state, and an eight-GPU list from an earlier
    version (which set_rng_state_all indexed past the GPUs there)."""
    if not check.gpu:
        raise Skipped("no GPU")
    require(child(check, RNG) == "restored", "the generator did not come back")
    line.detail = "this GPU's generator restored, from its own state and from an eight-GPU list"


