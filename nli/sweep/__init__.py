"""Sweeps: each job's row in the sweep's table as it ends (a Hydra callback, under every launcher), what each
job used (GPU-hours, a Vertex AI job's cost), the report, whether two settings or two runs are told apart, a
Vertex AI sweep found again, a local sweep with a GPU slot per job, and Optuna searches: their trials in flight,
and the pruning of those the study gives up."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "table": ["SweepResults"],
}, ["calibration_plot", "compare", "cost", "differences", "leaderboard", "names", "plots", "pruning", "report",
    "search", "slots", "table", "vertex"])
