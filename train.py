"""Fine-tune a transformer encoder on a GLUE task; every choice comes from conf/.

    python train.py experiment=quickstart
    python train.py model=roberta-large task=mnli hw=v100
    python train.py -m task=rte,mrpc optimizer.lr=1e-5,2e-5 seed=1,2,3
"""

if __name__ == "__main__":  # first: a signal during the half second of imports below stops it in one line
    from nli.runtime.signals import stop_while_starting

    stop_while_starting()

from pathlib import Path

import hydra
from omegaconf import DictConfig

from nli.cli import process, train
from nli.config.schema import register_configs

CONF = Path(__file__).resolve().parent / "conf"

register_configs()


@hydra.main(config_path=str(CONF), config_name="train", version_base="1.3")
def main(cfg: DictConfig) -> float:
    return train(cfg)  # imports torch only once the config checks: `--help` and `--cfg` answer without it


if __name__ == "__main__":
    process(main, CONF)  # --help without Hydra, then Hydra's main
