"""Training: the loop (mixed precision, accumulation, clipping, evaluation and checkpoints on schedule), the
optimizer and schedule, checkpoints written whole and verified, and the hooks the loop calls."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "checkpoint": ["CHECKPOINTS_CLAIM", "BestEvaluation", "Checkpointer", "Checkpoints", "Progress", "RandomState",
                   "Snapshot", "Stateful", "TrainingState", "checkpoint_name", "run_checkpoints", "seed_everything",
                   "seed_rank"],
    "hooks": ["EarlyStopping", "Hook", "MetricsLog", "ProgressBar", "Pruning", "Revisit", "SyncLogs", "judge"],
    "loop": ["Loop", "Optimization", "Plan", "Scaler", "TrainResult", "grad_scaler"],
    "optim": ["build_optimizer", "build_scheduler", "constant", "cosine", "linear"],
}, [])
