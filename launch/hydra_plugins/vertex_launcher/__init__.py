"""A Hydra launcher that runs every job of a sweep as a Vertex AI CustomJob: ``hydra/launcher=vertex``.

What it uses of the framework, and nothing else (tests/project/test_imports.py holds it to this):

- ``nli.contract``: what a run and its launcher agree on: the job's folders, files and needs;
- ``nli.errors``: ``UserError``, the one-line errors a user can fix;
- ``nli.io.storage``: ``Storage``, a folder on local disk or ``gs://``;
- ``nli.sweep.table``: the sweep's table: each job's row (``job_row``, ``own_results``, ``record``), the running
  sweep's stamp (``running_sweep``, ``SWEEP_ID``), the table printed at the end (``table``);
- ``nli.sweep.cost``: the row's cost columns (``COST_USD``, ``ROUNDING``) and a job's ``gpu_hours``;
- ``nli.runtime.provenance``: ``code``, the commit and whether the checkout differs from it;
- ``nli.config.schema``: ``job_refusal``, why the schema's rules refuse a job's config (a search's trial), so that
  no machine starts for a job that would stop as it starts.
"""

__version__ = "0.1.0"
