"""``--help`` for ``train.py`` and ``python -m nli``, answered from ``conf/`` in about a second.

Hydra's own ``--help`` asks its config loader for the options of every config group, its own and
the app's, and each question deep-copies the whole config repository, ConfigStore included: about
3 s for this project, every time someone asks. The app's groups are the folders of ``conf/``, so
they are read from there; the config is composed once, with Hydra's compose API and the same
overrides; the text follows the composed ``hydra.help`` template, so a customised template still
applies. Whatever needs Hydra's full machinery (its own groups, its flags, other flags such as
``--resolve``) is left to Hydra. An override that does not compose is Hydra's message, without the
traceback Hydra's own help ends in.
"""

from __future__ import annotations

import logging
import string
from pathlib import Path
from typing import Dict, List, Optional

from hydra import compose, initialize_config_dir
from hydra.errors import HydraException
from omegaconf import DictConfig, OmegaConf, open_dict

from nli.config import ConfigError

HELP_FLAGS = ("--help", "-h")
HYDRA_ONLY = ("$HYDRA_CONFIG_GROUPS", "$FLAGS_HELP", "${HYDRA_CONFIG_GROUPS}", "${FLAGS_HELP}")


def config_groups(conf_dir: Path) -> Dict[str, List[str]]:
    """Every folder of ``conf_dir`` that holds configs, with its options (the file names)."""
    groups = {}
    for folder in sorted(path for path in conf_dir.rglob("*") if path.is_dir()):
        options = sorted(path.stem for path in folder.glob("*.yaml"))
        if options:
            groups[folder.relative_to(conf_dir).as_posix()] = options
    return groups


def help_text(conf_dir: Path, config_name: str, overrides: List[str]) -> Optional[str]:
    """The app's help as Hydra would print it, or None where only Hydra can write it."""
    try:
        with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
            cfg = compose(config_name, overrides=overrides, return_hydra_config=True)
    except HydraException as err:
        raise SystemExit(f"error: {err}") from None  # Hydra's own --help would end in a traceback
    template = cfg.hydra.help.template
    if any(name in template for name in HYDRA_ONLY):
        return None
    with open_dict(cfg):
        del cfg["hydra"]  # as Hydra shows it: the job's config alone
    groups = "".join(f"{group}: {', '.join(options)}\n" for group, options in config_groups(conf_dir).items())
    return string.Template(template).substitute(APP_CONFIG_GROUPS=groups, CONFIG=OmegaConf.to_yaml(cfg))


def answer_help(argv: List[str], conf_dir: Path, config_name: str) -> bool:
    """Print the help if ``argv`` asks for it and this module can write it; True if it did."""
    if not any(arg in HELP_FLAGS for arg in argv):
        return False
    rest = [arg for arg in argv if arg not in HELP_FLAGS]
    if any(arg.startswith("-") for arg in rest):
        return False
    text = help_text(conf_dir, config_name, rest)
    if text is None:
        return False
    print(text)
    return True


def train(cfg: DictConfig) -> float:
    """Hydra's task function for ``train.py`` and ``python -m nli``. The config's rules are checked
    before torch and transformers load (about 9 s), so a wrong value is answered in a second."""
    try:
        OmegaConf.to_object(cfg)
    except ConfigError as err:
        logging.getLogger("nli.run").error("%s", err)  # into the run's log, as nli.run logs it
        raise SystemExit(f"error: {err}") from None
    from nli.run import main as run

    return run(cfg)
