"""What a run is told besides its config: where it writes, what it is called, where its process stands.

The command line (nli.cli) makes one from Hydra and the platform (nli.runtime.platform); a notebook or a test
makes one with :func:`local`. The recipe reads this and its config, and nothing global: a run is a
plain function call (``nli.recipe.run(cfg, context)``).

Light on purpose (no torch): the command line makes it before torch loads.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Union, cast

from omegaconf import OmegaConf

from nli.config.schema import Config, checked
from nli.errors import ConfigError


@dataclass(frozen=True)
class RunContext:
    """Where one run writes and how its loggers name it."""

    output_dir: str  # results, model/, config.yaml and (unless checkpoint_dir) checkpoints: a local path or gs://
    resolved: Dict[str, Any]  # the resolved config, plain values: the run's identity, config.yaml and the loggers
    checkpoint_dir: Optional[str] = None  # local path or gs://; None: <output_dir>/checkpoints
    log_dir: Optional[str] = None  # where the loggers' files belong (Vertex AI's TensorBoard folder); None: output_dir
    local_dir: Optional[str] = None  # a local folder for the loggers' files if log_dir is a bucket; None: a temp one
    name: Optional[str] = None  # the run's name in the loggers; None: the output folder's name
    group: Optional[str] = None  # the sweep this run is a job of: its jobs share it in the loggers; None: none
    overrides: Dict[str, str] = field(default_factory=dict)  # a sweep job's overrides, key -> value as typed
    command: List[str] = field(default_factory=list)  # the overrides the run was started with, as typed
    process_env: Dict[str, str] = field(default_factory=dict)  # torch.distributed's variables; empty: one process

    @property
    def run_name(self) -> str:
        return self.name or Path(self.output_dir.rstrip("/")).name


def resolved(cfg: Config) -> Dict[str, Any]:
    """``cfg`` as plain values (enums as their names), as the command line resolves Hydra's config."""
    return cast(Dict[str, Any], OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True, enum_to_str=True))


def local(cfg: Config, output_dir: Union[str, Path, None] = None) -> RunContext:
    """The context of a run started from Python (a notebook, a test): it writes into ``output_dir``
    (else ``cfg.output_dir``), one process, named after its folder."""
    where = output_dir if output_dir is not None else cfg.output_dir
    if where is None:
        raise ConfigError("a run started from Python writes into output_dir: pass output_dir=... or set it in the "
                          "config (output_dir=outputs/my-run)")
    cfg = checked(cfg)  # edited since it was composed: named here, as the run would name it
    return RunContext(output_dir=str(where), resolved=resolved(cfg), checkpoint_dir=cfg.train.checkpoint_dir)


CONSOLE_FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, as train.py's console shows it


@contextmanager
def console_log(enabled: Optional[bool] = None) -> Iterator[None]:
    """A run started from Python logs to stderr as ``train.py`` does: Python's logging, left unconfigured, drops
    INFO records, and a notebook's run printed nothing for its whole length. ``enabled``: None logs only where no
    handler is configured (the command line's Hydra, or the caller, shows the log otherwise); False never."""
    ours = logging.getLogger("nli")
    if enabled is False or (enabled is None and (logging.getLogger().handlers or ours.handlers)):
        yield
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
    level = ours.level
    ours.addHandler(handler)
    ours.setLevel(logging.INFO)
    try:
        yield
    finally:
        ours.removeHandler(handler)
        ours.setLevel(level)
