"""A checkpoint by its last path part, for a search's study and folder: ``${nli.checkpoint_name:...}``.

conf/hparams_search/glue.yaml names its study ``${task.name}-${nli.checkpoint_name:${model.name_or_path}}``, and
the study names the sweep's folder: ``FacebookAI/roberta-base`` (a Hub id) is ``roberta-base``, a local
``/data/rte/model/`` is ``model``, one folder level each, where the whole id or path made nested folders
(``search/rte-FacebookAI/roberta-base``).

Light on purpose (no torch): nli.sweep.table imports it, and Hydra resolves the sweep's folder before any job.
"""

from __future__ import annotations

from omegaconf import OmegaConf

RESOLVER = "nli.checkpoint_name"


def checkpoint_name(name_or_path: object) -> str:
    """The last part of a checkpoint's Hub id or path; a model from scratch (None) as ``None``."""
    text = str(name_or_path).rstrip("/")
    return text.rsplit("/", 1)[-1] or text


if not OmegaConf.has_resolver(RESOLVER):
    OmegaConf.register_new_resolver(RESOLVER, checkpoint_name)
