"""What a run leaves: the best model exported (and a finished run's export checked), its model card, test
predictions in GLUE's submission format, and whether a folder's run may go on there."""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "folder": ["Outputs", "check_continuation", "earlier_run", "record_code", "record_run"],
    "modelcard": ["Card"],
}, ["export", "results", "submission"])
