"""``python -m nli ARGS`` is ``python train.py ARGS``: what Vertex AI's Python-package jobs run.

An installed wheel or sdist carries the config inside the package (``nli/conf``); a source checkout
keeps it at the top (``conf/``)."""

if __name__ == "__main__":  # first: a signal during the half second of imports below stops it in one line
    from nli.runtime.signals import stop_while_starting

    stop_while_starting()

import hydra
from omegaconf import DictConfig

from nli.cli import process, train
from nli.config.schema import config_dir, register_configs

CONF = config_dir()

register_configs()


@hydra.main(config_path=str(CONF), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return train(cfg)  # imports torch only once the config checks: `--help` and `--cfg` answer without it


if __name__ == "__main__":
    process(main, CONF)  # --help without Hydra, then Hydra's main
