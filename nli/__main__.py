"""``python -m nli ARGS`` is ``python train.py ARGS``: what Vertex AI's Python-package jobs run.

An installed wheel or sdist carries the config inside the package (``nli/conf``); a source checkout
keeps it at the top (``conf/``)."""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig

from nli.cli import train
from nli.config import register_configs
from nli.help import answer_help

_PACKAGE = Path(__file__).resolve().parent
CONF = _PACKAGE / "conf" if (_PACKAGE / "conf").is_dir() else _PACKAGE.parent / "conf"

register_configs()


@hydra.main(config_path=str(CONF), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return train(cfg)  # imports torch only once the config checks: `--help` and `--cfg` answer without it


if __name__ == "__main__":
    if not answer_help(sys.argv[1:], CONF, "train"):  # Hydra's own --help takes seconds (nli/help.py)
        main()
