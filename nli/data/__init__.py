"""A task's examples: where they come from (the Hub, a GLUE directory, your own files, the synthetic task),
tokenized once, and batched with dynamic padding.

- ``sources``: where a task's raw examples come from
- ``synthetic``: the offline NLI task the project generates
- ``loaders``: splits, tokenization, length-bucketed batches, the epoch sampler"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "loaders": ["EpochSampler", "LengthGroups"],
}, ["loaders", "sources", "synthetic"])
