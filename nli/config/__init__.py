"""The config: the typed schema of every group, the checks every key and value pass, a run's identity, the
command line checked before Hydra starts, ``--help``, and the config a run folder recorded."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "schema": ["Accelerator", "AdamConfig", "Attention", "Config", "DIAGNOSTIC_SPLIT", "DataConfig",
               "DiagnosticConfig", "EvalConfig", "GlueFilesConfig", "HardwareConfig", "LoggerConfig", "LoraConfig",
               "METRIC_NAMES", "ModelConfig", "OptimizerConfig", "Precision", "PrecisionConfig", "SGDConfig",
               "ScheduleConfig", "ScratchArchitecture", "TaskConfig", "TrainConfig", "WandbConfig", "WandbMode",
               "checked", "config_dir", "job_refusal", "register_configs", "task_config"],
    "keys": ["built", "check_known", "key_of"],
    "help": ["answer_help"],
    "command": ["compose"],
}, ["command", "identity", "paths", "runfolder"])
