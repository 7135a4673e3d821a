"""This machine, one process, nothing set by a launcher: every question is left to the run's config
(the Hydra run directory, checkpoints beside the outputs)."""

from __future__ import annotations

import signal
from typing import Dict, Mapping, Optional


class Local:
    name = "local"

    def applies(self, env: Mapping[str, str]) -> bool:
        return True

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        return None

    def output_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return None

    def checkpoint_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return None

    def log_dir(self, env: Mapping[str, str]) -> Optional[str]:
        return None

    def requeue_signal(self, env: Mapping[str, str]) -> Optional[signal.Signals]:
        return None


LOCAL = Local()
