"""The app Hydra's LauncherTestSuite sweeps, as a container image would hold it.

The suite composes ``hydra.test_utils.a_module``'s configs in the test process and runs an in-process
task function; a Vertex AI job instead runs an image's own entry point. This is that entry point:
the same configs (the launcher passes ``--config-name``), the custom resolver the suite registers, and
a task function that returns what the suite's return (``100``, or ``cfg.x`` where the config has it).
"""

import hydra
from omegaconf import DictConfig, OmegaConf

OmegaConf.register_new_resolver("my_custom_resolver", lambda: "foo")


@hydra.main(config_path="pkg://hydra.test_utils.configs", config_name=None, version_base=None)
def main(cfg: DictConfig) -> object:
    return cfg.x if "x" in cfg else 100


if __name__ == "__main__":
    main()
