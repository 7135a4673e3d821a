"""Sweeps: each job's row in the sweep's table as it ends (a Hydra callback, under every launcher), the
report, a Vertex AI sweep found again, and a local sweep with a GPU slot per job.

- ``table``: the sweep's table, the seeds' means, its exit status; one sweep at a time in a folder
- ``report``: ``python -m nli.report``: the tables in Markdown, and plots
- ``vertex``: ``python -m nli.cloud attach|cancel|logs``: a Vertex AI sweep found again from its record
- ``local_gpus``: ``hydra/launcher=local-gpus``: a GPU slot per job"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "table": ["SweepResults"],
}, ["report", "table", "vertex"])
