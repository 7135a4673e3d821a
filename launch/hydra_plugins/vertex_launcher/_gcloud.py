"""What gcloud was told (``gcloud config set project my-project``, ``gcloud config set ai/region ...``), read
as gcloud reads it, so that the launcher's project and region follow the user's gcloud without being typed
again: a property's variable (``CLOUDSDK_CORE_PROJECT``, ``CLOUDSDK_AI_REGION``), else the active
configuration's file (``$CLOUDSDK_CONFIG``, by default ``~/.config/gcloud``; the configuration named by
``CLOUDSDK_ACTIVE_CONFIG_NAME`` or the ``active_config`` file, else ``default``).

Registered as the resolver ``${gcloud:SECTION/NAME,DEFAULT}`` (conf/hydra/launcher/vertex.yaml). Reading
it never runs gcloud, and a machine without gcloud simply has no properties.
"""

from __future__ import annotations

import configparser
import logging
import os
from pathlib import Path
from typing import Any, Optional, Set

log = logging.getLogger(__name__)
_WARNED: Set[Path] = set()  # configuration files said to be unreadable, once each


def config_folder() -> Path:
    if os.environ.get("CLOUDSDK_CONFIG"):
        return Path(os.environ["CLOUDSDK_CONFIG"])
    if os.name == "nt" and os.environ.get("APPDATA"):
        return Path(os.environ["APPDATA"]) / "gcloud"
    return Path.home() / ".config" / "gcloud"


def active_configuration(folder: Path) -> str:
    named = os.environ.get("CLOUDSDK_ACTIVE_CONFIG_NAME")
    if named:
        return named
    try:
        return (folder / "active_config").read_text().strip() or "default"
    except OSError:
        return "default"


def gcloud_property(name: str) -> Optional[str]:
    """The value of gcloud property ``SECTION/NAME`` (``core/project``), None where it is not set."""
    section, _, key = name.partition("/")
    variable = os.environ.get(f"CLOUDSDK_{section}_{key}".upper())
    if variable:
        return variable
    folder = config_folder()
    path = folder / "configurations" / f"config_{active_configuration(folder)}"
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError) as error:  # as if unset, said once: the file and its fault
        if path not in _WARNED:
            _WARNED.add(path)
            log.warning("gcloud's configuration %s cannot be read (%s): none of its properties is used here; "
                        "`gcloud config list` shows what is wrong with it", path, " ".join(str(error).split()))
        return None
    return parser.get(section, key, fallback=None) or None


def resolve(name: str, default: Any = None) -> Any:
    """``${gcloud:core/project}``: the property, else ``default``."""
    value = gcloud_property(name)
    return default if value is None else value
