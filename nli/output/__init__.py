"""What a run leaves: the best model exported (and a finished run's export checked), its model card, test
predictions in GLUE's submission format, and whether a folder's run may go on there.

- ``export``: the best model exported to ``model/``, and checked against ``export.json``
- ``modelcard``: the exported model's ``README.md``
- ``submission``: test predictions in GLUE's submission format
- ``folder``: what an output folder holds, whether a run may go on there, and with what new values"""

from nli._face import face

__all__, __getattr__, __dir__ = face(__name__, {
    "folder": ["check_continuation", "earlier_run"],
    "modelcard": ["Card"],
}, ["export", "submission"])
