"""Fine-tuning transformer encoders on GLUE from composable Hydra config. Its packages stand in layers, each
importing only from those below it: errors and contract, io, config, runtime, data, model, evaluate,
tracking, train, output, sweep; the recipe and the commands on top (docs/code-map.md)."""
