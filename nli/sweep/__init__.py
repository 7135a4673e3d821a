"""Sweeps: each job's row in the sweep's table as it ends (a Hydra callback, under every launcher), the
report, a Vertex AI sweep found again, and a local sweep with a GPU slot per job."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "table": ["SweepResults"],
}, ["report", "table", "vertex"])
