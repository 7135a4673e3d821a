"""Fixtures of the framework's unit tests: an output folder on local disk or on Cloud Storage (the emulator)."""

from __future__ import annotations

import uuid
from http import HTTPStatus
from pathlib import Path
from typing import Any, Callable, Dict

import pytest

from nli.io.storage import Storage

# --- Cloud Storage as the tests need it ---------------------------------------------------------


def _honouring_preconditions(handler: Callable[..., Any]) -> Callable[..., Any]:
    """An emulator handler that first checks ``ifGenerationMatch`` as Cloud Storage does: 412
    unless the object's live generation is the one given (0: no live object)."""
    from gcp_storage_emulator.exceptions import NotFound

    def checked(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        wanted = request.query.get("ifGenerationMatch")
        if wanted:
            name = (request.params.get("object_id") or (request.query.get("name") or [None])[0]
                    or request.data["meta"]["name"])
            try:
                live = str(storage.get_file_obj(request.params["bucket_name"], name)["generation"])
            except NotFound:
                live = "0"
            if live != wanted[0]:
                response.status = HTTPStatus.PRECONDITION_FAILED
                response.json({"error": {"code": 412, "message": "conditionNotMet"}})
                return None
        return handler(request, response, storage, *args, **kwargs)

    return checked


@pytest.fixture
def gcs(gcs_emulator: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Dict[str, str]:
    """The emulator, honouring ``ifGenerationMatch`` on uploads and deletes for this test:
    gcp-storage-emulator ignores it (test_the_emulator_ignores_generation_preconditions), and a
    claim on Cloud Storage rests on it. Its server answers one request at a time, so the check and
    the write are one step, as on Cloud Storage."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler in (objects.insert, objects.delete):
                monkeypatch.setitem(handlers, method, _honouring_preconditions(handler))
    return gcs_emulator


@pytest.fixture(params=["local", "gs"])
def folder(request: pytest.FixtureRequest, tmp_path: Path) -> Storage:
    """An output folder on local disk, or on Cloud Storage (the emulator), each test's own."""
    if request.param == "local":
        return Storage(str(tmp_path / "run"))
    request.getfixturevalue("gcs")
    return Storage(f"gs://test-bucket/folders/{uuid.uuid4().hex}")
