"""Sweeps: each job's row in the sweep's table as it ends (a Hydra callback, under every launcher), the
report, a Vertex AI sweep found again, a local sweep with a GPU slot per job, and Optuna searches."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "table": ["SweepResults"],
}, ["report", "search", "table", "vertex"])
