"""Benchmarks of the framework, each run from the repository root as a module:
``python -m benchmarks.vs_trainer``, ``python -m benchmarks.step_ablation``,
``python -m benchmarks.scaling``, ``python -m benchmarks.mnli_like`` (figures: ``RESULTS.md``),
``python -m benchmarks.memory`` (will each recipe fit each GPU preset: docs/distributed.md).
Not part of the installed package."""
