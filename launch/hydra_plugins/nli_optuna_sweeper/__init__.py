"""The project's Optuna sweeper as Hydra finds it (``hydra/sweeper=optuna``); the search itself is
``nli.sweep.search``."""
