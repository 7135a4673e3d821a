"""``torchrun`` (or any launcher that sets torch.distributed's standard variables): the processes
are placed already; the rest is left to the platforms around it."""

from __future__ import annotations

from typing import Dict, Mapping, Optional

from nli.runtime.platform.local import Local

VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


class Torchrun(Local):
    name = "torchrun"

    def applies(self, env: Mapping[str, str]) -> bool:
        return "RANK" in env

    def process_env(self, env: Mapping[str, str]) -> Optional[Dict[str, str]]:
        return {name: env[name] for name in VARIABLES if name in env}


TORCHRUN = Torchrun()
