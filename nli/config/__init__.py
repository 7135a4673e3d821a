"""The config: the typed schema of every group, the checks every key and value pass, a run's identity, the
command line checked before Hydra starts, ``--help``, and the config a run folder recorded.

- ``schema``: the typed schema of every group, registered in Hydra's ConfigStore; ``compose``
- ``keys``: every key the schema's, or refused by name with the keys meant
- ``identity``: what a run computes, so that a folder holds one run
- ``command``: ``python train.py``'s command line, checked before Hydra writes anything
- ``help``: ``--help``, each key with its description from ``schema``
- ``runfolder``: an evaluation-only run of a run folder reads the settings its run trained with"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "schema": ["Accelerator", "AdamConfig", "Attention", "Config", "DataConfig", "EvalConfig", "GlueFilesConfig",
               "HardwareConfig", "LoggerConfig", "LoraConfig", "METRIC_NAMES", "ModelConfig", "OptimizerConfig",
               "Precision", "PrecisionConfig", "SGDConfig", "ScheduleConfig", "ScratchArchitecture", "TaskConfig",
               "TrainConfig", "WandbConfig", "WandbMode", "compose", "config_dir", "register_configs"],
    "keys": ["check_known"],
    "help": ["answer_help"],
}, ["command", "identity", "runfolder"])
