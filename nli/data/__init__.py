"""A task's examples: where they come from (the Hub, a GLUE directory, your own files, the synthetic task),
tokenized once, and batched with dynamic padding."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "loaders": ["Batching", "Contents", "EpochSampler", "LengthGroups", "Loader", "TrainBatches", "Workers",
                "release_workers"],
}, ["loaders", "sources", "synthetic"])
