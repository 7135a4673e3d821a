"""The GPU check's environment line: what the machine and its libraries are, and the GPUs torch and NVML see."""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict

from benchmarks.gpu_check import Figures
from benchmarks.gpu_check.subruns import Check, Line, OutOfTime, await_end, last_line, launch

ENVIRONMENT = r"""
import json, platform, sys
import torch, transformers
out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
       "transformers": transformers.__version__}
for name in ("huggingface_hub", "tokenizers", "datasets", "hydra", "omegaconf", "numpy", "pyarrow", "accelerate"):
    try:
        out[name] = __import__(name).__version__
    except Exception as error:
        out[name] = f"missing ({type(error).__name__}: {error})"
out["gpus_torch"] = torch.cuda.device_count()
if not torch.cuda.is_available():
    try:
        torch.cuda.init()  # says why: no driver, a driver older than this CUDA, a build without CUDA
        out["cuda_error"] = "torch.cuda.is_available() is false"
    except Exception as error:
        out["cuda_error"] = f"{type(error).__name__}: {error}"[:300]
if torch.cuda.is_available():
    props = torch.cuda.get_device_properties(0)
    out.update(device=torch.cuda.get_device_name(0), capability=".".join(map(str, torch.cuda.get_device_capability(0))),
               memory_gib=round(props.total_memory / 2**30, 1), bf16=torch.cuda.is_bf16_supported())
try:
    from nli.model.fastpaths import TRANSFORMERS
    ok = transformers.__version__ in TRANSFORMERS
    out["fast_paths"] = (f"written for transformers {TRANSFORMERS}, this is {transformers.__version__}: "
                         + ("they apply (first_token on a GPU)" if ok else "they step aside: the stock forward"))
except Exception as error:
    out["fast_paths"] = f"unknown: nli.model.fastpaths does not import ({type(error).__name__}: {error})"
print(json.dumps(out))
"""


def nvidia_smi(check: Check) -> Figures:
    """The GPUs NVML sees (``nvidia-smi --query-gpu``, whatever CUDA_VISIBLE_DEVICES says): their count and names, or
    why nvidia-smi could not say."""
    if shutil.which("nvidia-smi") is None:
        return {"gpus_nvml": None, "nvml": "nvidia-smi: not found"}
    command = ["nvidia-smi", "--query-gpu=index,name,memory.total,driver_version", "--format=csv,noheader"]
    with tempfile.TemporaryFile() as stdout:
        try:
            proc = launch(check, command, stdout)
        except OutOfTime as why:
            return {"gpus_nvml": None, "nvml": f"nvidia-smi: {why}"}
        ended = await_end(check, proc, 30.0)
        stdout.seek(0)
        text = stdout.read().decode(errors="replace")
    problem = ended.why("nvidia-smi", 30.0)
    if problem is not None:
        return {"gpus_nvml": None, "nvml": f"{problem}; last line: {last_line(text)}"}
    gpus = [row.strip() for row in text.splitlines() if row.strip()]
    return {"gpus_nvml": len(gpus), "nvml": gpus}


def gpus_line(environment: Dict[str, Any], nvml: Figures) -> Line:
    """Line 0: the GPUs as torch sees them and as NVML (nvidia-smi) does. It fails where NVML lists a GPU that torch
    cannot use: every GPU line would otherwise be 'skipped: no GPU', on a GPU machine."""
    line = Line("gpus", "0. GPUs as torch and as NVML (nvidia-smi) see them")
    seen, listed = environment.get("gpus_torch"), nvml.get("gpus_nvml")
    line.figures.update(torch=seen, nvidia_smi=listed if listed is not None else nvml.get("nvml"),
                        CUDA_VISIBLE_DEVICES=os.environ.get("CUDA_VISIBLE_DEVICES", "(not set)"))
    if listed and not seen:
        line.status = "fail"
        line.detail = (f"nvidia-smi lists {listed} GPU(s) and torch sees none: "
                       f"{environment.get('cuda_error') or environment.get('error', 'torch did not say why')}")
    elif not listed and not seen:
        line.status = f"skipped: no GPU ({nvml.get('nvml') if listed is None else 'nvidia-smi lists none'})"
    else:
        line.status = "pass"
        line.detail = (f"torch sees {seen} GPU(s), nvidia-smi {listed if listed is not None else '(no answer)'}"
                       + ("" if seen == listed else ": they differ (CUDA_VISIBLE_DEVICES, or GPUs NVML lists that "
                          "CUDA cannot use)"))
    return line


