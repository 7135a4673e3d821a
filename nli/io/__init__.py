"""Storage, claims and copies: a run's output folder on local disk or ``gs://`` (every write all-or-nothing),
the claim that keeps one writer to a folder, data files in a bucket fetched once into a local cache, and
Hugging Face Hub downloads that fail once, early and clearly."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "storage": ["Storage", "TIMEOUT", "digest", "file_in_the_way", "write_failed", "write_refusal"],
    "claim": ["Claim", "ClaimedError", "HOST", "Owner", "Use", "held_since", "live_holder"],
    "hub": ["hub_download"],
}, ["remote"])
