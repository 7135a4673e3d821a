"""The output folder: one run's claim on it (nli.io.claim), on local disk and on Cloud Storage (the local
emulator), writes that two writers cannot spoil, modes from the umask, and Cloud Storage failures
told in one line, with the fix, within seconds."""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

import pytest

from nli.errors import StorageError
from nli.io.claim import CLAIM_FILE, HOST, Claim, ClaimedError, ClaimLostError, Owner
from nli.io.storage import Storage, umask, write_failed
from tests.support.diskfull import full, needs_full, room
from tests.support.runs import ROOT, read_line

# Claims that beat fast, so that a test sees several heartbeats in a fraction of a second.
FAST = {"heartbeat": 0.05, "stale_after": 0.5}


def plant(storage: Storage, owner: Owner) -> None:
    """Another run's claim, written as it is (no precondition)."""
    storage.write_bytes(CLAIM_FILE, owner.encode())


def current(storage: Storage) -> Optional[Owner]:
    try:
        return Owner.decode(storage.read_bytes(CLAIM_FILE))
    except FileNotFoundError:
        return None


def other(*, host: str = HOST, pid: int = 1, age: float = 0.0) -> Owner:
    """A claim of another run; ``age``: seconds since its last heartbeat."""
    now = time.time()
    return Owner(host=host, pid=pid, started=now - age - 60, token=uuid.uuid4().hex, heartbeat=now - age)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# A run in a process of its own: takes the claim, says so, and holds it until its stdin closes.
CHILD = """
import signal, sys
from nli.io.claim import Claim, ClaimedError
from nli.io.storage import Storage

class Stop(Exception):
    pass

def stop(*_):
    raise Stop()  # as nli.runtime.signals does: the run unwinds

signal.signal(signal.SIGTERM, stop)
try:
    with Claim.take(Storage(sys.argv[1]), heartbeat=float(sys.argv[2]), stale_after=10 * float(sys.argv[2])) as claim:
        print("won", claim.owner.token, flush=True)
        sys.stdin.read()
except ClaimedError as err:
    print("refused", err, flush=True)
except Stop:
    print("stopped", flush=True)
"""


def child(storage: Storage, heartbeat: float = 0.05) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", CHILD, storage.url, str(heartbeat)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, cwd=ROOT)


# --- claims ---------------------------------------------------------------------------------------


@pytest.mark.process
def test_a_second_run_is_refused_at_once_naming_the_first(folder: Storage) -> None:
    with Claim.take(folder, **FAST) as claim:
        started = time.monotonic()
        proc = child(folder)
        answer = read_line(proc.stdout)
        proc.communicate(timeout=30)
        assert answer.startswith("refused ")
        assert f"{folder.describe()} is in use by another run: host {HOST}, pid {os.getpid()}, started " in answer
        assert f"if that run is gone, delete {folder.describe(CLAIM_FILE)}" in answer
        assert time.monotonic() - started < 15  # at once: no waiting for the claim to go stale
        with pytest.raises(ClaimedError, match=f"pid {os.getpid()}, started .* UTC \\(heartbeat 0 s ago\\)"):
            Claim.take(folder, **FAST)  # from this very process too
        assert current(folder).token == claim.owner.token  # the refused runs left it alone


@pytest.mark.process
def test_the_claim_of_a_process_that_no_longer_runs_is_taken_over(folder: Storage,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    gone = other(pid=dead_pid())
    plant(folder, gone)
    with caplog.at_level(logging.WARNING, logger="nli.io.claim"), Claim.take(folder, **FAST) as claim:
        assert current(folder).token == claim.owner.token
    assert f"host {HOST}, pid {gone.pid}, started" in caplog.text
    assert f"pid {gone.pid} no longer runs on {HOST}. Taking it over" in caplog.text


@pytest.mark.process
def test_a_sigkilled_run_leaves_a_claim_the_next_run_takes_over(folder: Storage,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    proc = child(folder, heartbeat=30)
    assert read_line(proc.stdout).startswith("won ")
    proc.kill()
    proc.wait()
    assert current(folder).pid == proc.pid  # what a killed run leaves behind
    with caplog.at_level(logging.WARNING, logger="nli.io.claim"), Claim.take(folder, **FAST):
        pass
    assert f"pid {proc.pid} no longer runs" in caplog.text


def test_a_stale_heartbeat_is_taken_over_whatever_the_host(folder: Storage, caplog: pytest.LogCaptureFixture) -> None:
    plant(folder, other(host="elsewhere", pid=4242, age=5))
    # Its age as the claim reads it: 5 s, or a few more where the machine is busy (CI beside other work)
    with pytest.raises(ClaimedError, match="host elsewhere, pid 4242, started .* \\(heartbeat [5-9] s ago\\)"):
        Claim.take(folder, heartbeat=1, stale_after=60)  # another host: its pid cannot be asked, only its heartbeat
    with caplog.at_level(logging.WARNING, logger="nli.io.claim"), \
            Claim.take(folder, heartbeat=1, stale_after=4) as claim:
        assert current(folder).token == claim.owner.token
    assert "host elsewhere, pid 4242" in caplog.text
    assert re.search(r"its last heartbeat was [5-9] s ago \(stale after 4 s\)", caplog.text)


@pytest.mark.process
@pytest.mark.parametrize("before", ["none", "stale"])
def test_of_runs_claiming_at_once_exactly_one_wins(folder: Storage, before: str) -> None:
    for _ in range(2 if folder.local else 1):
        if before == "stale":
            plant(folder, other(host="elsewhere", age=100))
        procs = [child(folder, heartbeat=1) for _ in range(4)]  # stale_after 10 s: the stale claim is 100 s old
        answers = [read_line(proc.stdout) for proc in procs]
        holder = current(folder)
        for proc in procs:
            proc.communicate(timeout=30)
        winners = [answer.split()[1] for answer in answers if answer.startswith("won ")]
        assert len(winners) == 1, answers
        assert holder is not None and holder.token == winners[0]
        assert all("is in use by another run" in answer for answer in answers if not answer.startswith("won "))
        assert current(folder) is None  # the winner released it


@pytest.mark.process
def test_the_claim_is_released_at_the_end_on_an_error_and_on_sigterm(folder: Storage) -> None:
    with Claim.take(folder, **FAST):
        assert current(folder) is not None
    assert current(folder) is None
    with pytest.raises(RuntimeError), Claim.take(folder, **FAST):
        raise RuntimeError("the run failed")
    assert current(folder) is None
    proc = child(folder)
    assert read_line(proc.stdout).startswith("won ")
    proc.send_signal(signal.SIGTERM)
    assert proc.communicate(timeout=30)[0].strip() == "stopped"
    assert current(folder) is None
    if folder.local:
        assert os.listdir(folder.root) == []  # nothing left behind: no claim, no temporary file


def test_the_heartbeat_keeps_the_claim_fresh(folder: Storage) -> None:
    with Claim.take(folder, heartbeat=0.1, stale_after=1.0) as claim:
        time.sleep(1.5)  # without heartbeats the claim would be stale by now
        seen = current(folder)
        assert seen is not None and seen.token == claim.owner.token and time.time() - seen.heartbeat < 1.0
        with pytest.raises(ClaimedError):
            Claim.take(folder, heartbeat=0.1, stale_after=1.0)
        assert not claim.lost


def test_a_claim_taken_over_meanwhile_is_reported_lost_and_left_alone(folder: Storage,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    usurper = other(host="elsewhere", pid=777)
    with caplog.at_level(logging.ERROR, logger="nli.io.claim"), Claim.take(folder, **FAST) as claim:
        claim.check()
        plant(folder, usurper)  # as a run that judged this one gone would
        deadline = time.monotonic() + 5
        while not claim.lost and time.monotonic() < deadline:
            time.sleep(0.02)
        assert claim.lost
        with pytest.raises(ClaimLostError, match=f"took over {folder.describe()} .*host elsewhere, pid 777"):
            claim.check()
    assert "this run must stop writing there" in caplog.text
    assert current(folder) == usurper  # released without deleting the other run's claim


def test_a_claim_cut_short_is_judged_by_its_age(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "run"))
    claim_file = tmp_path / "run" / CLAIM_FILE
    claim_file.parent.mkdir()
    claim_file.write_bytes(b'{"host": "vm", "pi')  # a crash while the claim was written
    with pytest.raises(ClaimedError, match="a claim that does not say whose it is \\(written 0 s ago\\)"):
        Claim.take(storage, heartbeat=1, stale_after=60)
    os.utime(claim_file, (time.time() - 120, time.time() - 120))
    with Claim.take(storage, heartbeat=1, stale_after=60) as claim:
        assert current(storage).token == claim.owner.token


def test_the_emulator_ignores_generation_preconditions(gcs_emulator: Dict[str, str]) -> None:
    """Why the Cloud Storage claims are tested through the fixture ``gcs``: gcp-storage-emulator
    accepts a write whatever ``ifGenerationMatch`` says. Should this fail, the emulator has learnt
    preconditions, and the fixture's own check can go."""
    blob = Storage(f"gs://test-bucket/{uuid.uuid4().hex}").blob("object")
    blob.upload_from_string(b"first", if_generation_match=0)
    blob.upload_from_string(b"second", if_generation_match=0)  # Cloud Storage: 412 Precondition Failed
    blob.delete(if_generation_match=1)  # likewise
    assert blob.bucket.get_blob(blob.name) is None


def test_on_cloud_storage_every_claim_write_names_the_generation(gcs: Dict[str, str],
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The claim's writes carry the preconditions that make it exclusive, whatever a server does with them."""
    from google.cloud.storage import Blob

    calls: List[Any] = []
    for method in ("upload_from_string", "delete"):
        original = getattr(Blob, method)

        def spy(self: Any, *args: Any, _original: Any = original, _method: str = method, **kwargs: Any) -> Any:
            calls.append((_method, kwargs.get("if_generation_match")))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(Blob, method, spy)
    folder = Storage(f"gs://test-bucket/claims/{uuid.uuid4().hex}")
    with Claim.take(folder, **FAST) as claim:
        time.sleep(0.2)
    assert calls[0] == ("upload_from_string", 0)
    assert all(call[0] == "upload_from_string" and call[1] not in (None, 0) for call in calls[1:-1])
    assert calls[-1] == ("delete", claim._backend.generation) and len(calls) > 3  # the last heartbeat's


# --- writes ---------------------------------------------------------------------------------------


@pytest.mark.process
def test_two_writers_of_one_file_leave_one_whole_file_and_nothing_else(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path))
    payloads = [bytes([65 + n]) * 200_000 for n in range(3)]

    def write(data: bytes) -> None:
        for _ in range(20):
            storage.write_bytes("results.json", data)

    threads = [threading.Thread(target=write, args=(data,)) for data in payloads]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert (tmp_path / "results.json").read_bytes() in payloads
    assert os.listdir(tmp_path) == ["results.json"]


@pytest.mark.process
def test_two_writers_of_one_folder_leave_one_whole_folder_and_nothing_else(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "out"))
    sources = []
    for n in range(2):
        source = tmp_path / f"source-{n}"
        (source / "sub").mkdir(parents=True)
        for name in ("model.safetensors", "config.json", "sub/tokenizer.json"):
            (source / name).write_text(f"{name} of writer {n}")
        sources.append(source)

    def upload(source: Path) -> None:
        for _ in range(15):
            storage.upload_dir(source, "model")

    threads = [threading.Thread(target=upload, args=(source,)) for source in sources]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    model = tmp_path / "out" / "model"
    texts = {p.relative_to(model).as_posix(): p.read_text() for p in model.rglob("*") if p.is_file()}
    assert texts in [{p.relative_to(s).as_posix(): p.read_text() for p in s.rglob("*") if p.is_file()}
                     for s in sources]
    assert os.listdir(tmp_path / "out") == ["model"]


def test_a_failed_write_leaves_the_previous_version_and_no_temporary_files(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(str(tmp_path / "out"))
    storage.write_text("config.yaml", "before")
    source = tmp_path / "source"
    source.mkdir()
    (source / "model.safetensors").write_text("before")
    storage.upload_dir(source, "model")

    def full(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(StorageError, match="could not write .*config.yaml: no space left on its disk: make room"):
        storage.write_text("config.yaml", "after")
    sendfile, sources = os.sendfile, []

    def copy_then_fill_the_disk(out_fd: int, in_fd: int, *args: Any) -> int:  # how shutil copies bytes on Linux
        sources.append(os.fstat(in_fd).st_ino)  # a file's descriptor number is the next one's too
        return sendfile(out_fd, in_fd, *args) if sources[-1] == sources[0] else full()  # type: ignore[func-returns-value]

    monkeypatch.setattr(os, "sendfile", copy_then_fill_the_disk)
    (source / "config.json").write_text("after")  # copied first (the files go in order), then the disk is full
    (source / "model.safetensors").write_text("after")
    (source / "tokenizer.json").write_text("after")
    with pytest.raises(StorageError, match="could not write .*model: no space left on its disk: make room") as raised:
        storage.upload_dir(source, "model")
    assert len(str(raised.value).splitlines()) == 1  # the first failure alone, not every file's (copytree's)
    assert len(set(sources)) == 2  # one file copied whole, the next refused: the copy stopped there
    assert (tmp_path / "out" / "config.yaml").read_text() == "before"
    assert (tmp_path / "out" / "model" / "model.safetensors").read_text() == "before"
    assert sorted(os.listdir(tmp_path / "out")) == ["config.yaml", "model"]


@pytest.mark.parametrize("mask", [0o022, 0o002])
def test_files_and_folders_get_the_modes_of_the_umask(tmp_path: Path, mask: int) -> None:
    previous = os.umask(mask)
    try:
        assert umask() == mask and umask() == mask  # read, not changed
        storage = Storage(str(tmp_path / "out"))
        storage.write_text("checkpoints/step-000001/checkpoint.json", "{}")
        with tempfile.TemporaryDirectory() as source:  # 0700, as save_pretrained's folder is
            (Path(source) / "sub").mkdir()
            for name in ("model.safetensors", "sub/vocab.txt"):
                fd, staged = tempfile.mkstemp(dir=Path(source) / Path(name).parent)  # 0600, as safetensors writes
                os.close(fd)
                os.rename(staged, Path(source) / name)
            storage.upload_dir(Path(source), "model")
    finally:
        os.umask(previous)
    out = tmp_path / "out"
    for folder in (out / "checkpoints" / "step-000001", out / "model", out / "model" / "sub"):
        assert folder.stat().st_mode & 0o777 == 0o777 & ~mask, folder
    for file in (out / "checkpoints" / "step-000001" / "checkpoint.json", out / "model" / "model.safetensors",
                 out / "model" / "sub" / "vocab.txt"):
        assert file.stat().st_mode & 0o777 == 0o666 & ~mask, file


@pytest.mark.process
def test_two_runs_checking_one_folder_at_once_do_not_trip_over_each_others_probe(tmp_path: Path) -> None:
    storage = Storage(str(tmp_path / "out"))
    errors: List[BaseException] = []

    def check() -> None:
        try:
            for _ in range(50):
                storage.check_writable()
        except BaseException as err:
            errors.append(err)

    threads = [threading.Thread(target=check) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == [] and os.listdir(tmp_path / "out") == []


# --- Cloud Storage failures ----------------------------------------------------------------------


@contextmanager
def answering(answer: Callable[[str], Tuple[int, Dict[str, Any]]]) -> Iterator[str]:
    """A local HTTP server that answers a request for a path with ``answer(path)``, a status and a
    JSON body: Cloud Storage or Google's token service saying no, without the network."""

    class Handler(BaseHTTPRequestHandler):
        def respond(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            status, body = answer(self.path)
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = respond

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def service_account_key(path: Path, token_uri: str) -> Path:
    """A service account key file, with a key of its own, whose tokens come from ``token_uri``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode()
    path.write_text(json.dumps({"type": "service_account", "project_id": "p", "private_key_id": "1",
                                "private_key": key, "client_email": "trainer@p.iam.gserviceaccount.com",
                                "client_id": "1", "token_uri": token_uri}))
    return path


def closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def refuse(storage: Storage, action: Callable[[Storage], Any] = Storage.check_writable) -> str:
    started = time.monotonic()
    with pytest.raises(StorageError) as caught:
        action(storage)
    assert time.monotonic() - started < 10
    return str(caught.value)


def test_a_missing_bucket_is_named_with_the_command_that_creates_it(gcs_emulator: Dict[str, str]) -> None:
    expected = ("output_dir=gs://no-such-bucket/run: bucket no-such-bucket does not exist "
                "(create it: gcloud storage buckets create gs://no-such-bucket)")
    assert refuse(Storage("gs://no-such-bucket/run")) == expected
    assert refuse(Storage("gs://no-such-bucket/run"), lambda s: Claim.take(s)) == expected


RELOGIN = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a valid key file"


@pytest.mark.parametrize(("status", "says"), [
    (403, "output_dir=gs://bucket/run: the service account trainer@p.iam.gserviceaccount.com may not write to "
          "gs://bucket (trainer@p.iam.gserviceaccount.com does not have storage.objects.create access): grant "
          "roles/storage.objectAdmin on the bucket, or use other credentials"),
    (401, "output_dir=gs://bucket/run: Google refused the service account trainer@p.iam.gserviceaccount.com "
          f"(Invalid Credentials): {RELOGIN}"),
])
def test_credentials_cloud_storage_turns_away_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        status: int, says: str) -> None:
    message = {403: "trainer@p.iam.gserviceaccount.com does not have storage.objects.create access",
               401: "Invalid Credentials"}[status]

    def answer(path: str) -> Tuple[int, Dict[str, Any]]:
        if path.startswith("/token"):  # Google's token service hands out a token ...
            return 200, {"access_token": "ya29.token", "expires_in": 3600, "token_type": "Bearer"}
        return status, {"error": {"code": status, "message": message}}  # ... that Cloud Storage turns away

    with answering(answer) as url:
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account_key(tmp_path / "key.json",
                                                                                    f"{url}/token")))
        monkeypatch.setenv("API_ENDPOINT_OVERRIDE", url)  # google-cloud-storage's Cloud Storage, with credentials
        assert refuse(Storage("gs://bucket/run")) == says


def test_credentials_google_refuses_are_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service account key that Google no longer honours (deleted, or its account disabled)."""
    with answering(lambda path: (400, {"error": "invalid_grant", "error_description": "Invalid JWT Signature."})) \
            as url:
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(service_account_key(tmp_path / "key.json",
                                                                                    f"{url}/token")))
        assert refuse(Storage("gs://bucket/run")) == (
            "output_dir=gs://bucket/run: Google refused the service account trainer@p.iam.gserviceaccount.com "
            f"(invalid_grant: Invalid JWT Signature.): {RELOGIN}")


def test_an_unreachable_cloud_storage_is_said_so_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", f"http://127.0.0.1:{closed_port()}")
    assert "output_dir=gs://bucket/run: cannot reach Cloud Storage (" in refuse(Storage("gs://bucket/run"))


def no_credentials_env(home: Path, **extra: str) -> Dict[str, str]:
    """A machine without Google credentials: no emulator, no key file, no gcloud configuration, and
    a metadata server (the one on Compute Engine) that refuses at once, so nothing leaves the machine."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("GOOGLE_", "GCE_", "CLOUDSDK_", "STORAGE_EMULATOR_HOST", "GCSFS_"))}
    metadata = f"127.0.0.1:{closed_port()}"
    return {**env, "HOME": str(home), "CLOUDSDK_CONFIG": str(home / "gcloud"), "GCE_METADATA_HOST": metadata,
            "GCE_METADATA_IP": metadata, "HYDRA_FULL_ERROR": "0", **extra}


@pytest.mark.process
@pytest.mark.parametrize("key_file", ["unset", "missing"])
def test_without_credentials_the_run_says_so_before_torch_loads(tmp_path: Path, key_file: str) -> None:
    """train.py with a Cloud Storage output and no credentials: one line that names them and the fix,
    answered before torch is imported (so in seconds, not after a minute of DNS retries as it was)."""
    home = tmp_path / "home"
    home.mkdir()
    extra = {"GOOGLE_APPLICATION_CREDENTIALS": str(tmp_path / "key.json")} if key_file == "missing" else {}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "experiment=quickstart",
                           "output_dir=gs://bucket/run", f"hydra.run.dir={tmp_path / 'run'}"],
                          env={**no_credentials_env(home, **extra), "PYTHONPROFILEIMPORTTIME": "1"},
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert proc.returncode == 1
    loaded = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in loaded and "transformers" not in loaded
    messages = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert "Traceback" not in proc.stderr and not any("Name or service not known" in line for line in messages)
    error = messages[-1]
    assert error.startswith("error: output_dir=gs://bucket/run: no usable Google Cloud credentials (")
    assert "Run `gcloud auth application-default login`, or " in error
    if key_file == "missing":
        assert f"File {tmp_path}/key.json was not found" in error
        assert f"point GOOGLE_APPLICATION_CREDENTIALS (now {tmp_path}/key.json) at a service account key file" in error
    else:
        assert "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file" in error


def test_a_streamed_write_is_whole_or_not_there_and_leaves_no_staging(folder: Storage) -> None:
    """write_stream, as a checkpoint's state is written: locally renamed over the file, on Cloud Storage
    uploaded from a local file once written; a writer that fails midway changes nothing."""
    def chunks(file: BinaryIO) -> None:
        for part in (b"first ", b"second ", b"third"):
            file.write(part)

    folder.write_stream("step-000005/state.pt", chunks)
    assert folder.read_bytes("step-000005/state.pt") == b"first second third"

    def fails_midway(file: BinaryIO) -> None:
        file.write(b"half of a new")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(StorageError, match="could not write .*state.pt: no space left on its disk: make room"):
        folder.write_stream("step-000005/state.pt", fails_midway)
    assert folder.read_bytes("step-000005/state.pt") == b"first second third"
    assert folder.list("step-000005") == ["state.pt"]
    with pytest.raises(StorageError, match="could not write .*state.pt"):
        folder.write_stream("step-000010/state.pt", fails_midway)
    assert not folder.exists("step-000010/state.pt")


def test_a_staged_folder_becomes_the_folder_whole_or_leaves_it_as_it_was(folder: Storage) -> None:
    """staged_dir, as an export is written: what the block writes is ``model/`` once it ends, all of it and
    nothing of the previous one; a block that fails midway (a full disk in save_pretrained) changes nothing
    and leaves no staging folder."""
    with folder.staged_dir("model") as staging:
        (staging / "sub").mkdir()
        (staging / "model.safetensors").write_bytes(b"first weights")
        (staging / "sub" / "vocab.txt").write_text("first vocab")
        (staging / "stale.txt").write_text("only in the first")
    with folder.staged_dir("model") as staging:
        (staging / "model.safetensors").write_bytes(b"second weights")
    assert folder.read_bytes("model/model.safetensors") == b"second weights"
    assert folder.list("model") == ["model.safetensors"]  # on Cloud Storage too: the first's other files removed

    with pytest.raises(StorageError, match="could not write .*model: no space left on its disk: make room"):
        with folder.staged_dir("model") as staging:
            (staging / "model.safetensors").write_bytes(b"half of the third")
            raise OSError(errno.ENOSPC, "No space left on device")
    assert folder.read_bytes("model/model.safetensors") == b"second weights"
    with pytest.raises(KeyboardInterrupt):
        with folder.staged_dir("model") as staging:
            (staging / "model.safetensors").write_bytes(b"half of the fourth")
            raise KeyboardInterrupt
    assert folder.read_bytes("model/model.safetensors") == b"second weights"
    if folder.local:
        assert os.listdir(Path(folder.path())) == ["model"]


def test_an_upload_cut_short_leaves_a_folder_without_its_record_not_an_old_record_over_new_files(
        gcs_emulator: Dict[str, str], monkeypatch: pytest.MonkeyPatch) -> None:
    """On Cloud Storage a staged folder is uploaded file by file: the file that vouches for the others (an
    export's export.json, ``record``) goes up last, and the old one is removed before the first, so that an upload
    a failed call cut short leaves a folder its reader refuses as damaged (nli.config.runfolder), never the last
    export's record beside the new export's weights. Uploaded in name order, export.json went before the weights."""
    from gcp_storage_emulator import server
    from gcp_storage_emulator.handlers import objects

    folder = Storage(f"gs://test-bucket/folders/{uuid.uuid4().hex}")
    with folder.staged_dir("model", record="export.json") as staging:
        (staging / "config.json").write_text("{}")
        (staging / "export.json").write_text("first record")
        (staging / "model.safetensors").write_bytes(b"first weights")

    uploaded: List[str] = []
    for _, handlers in server.HANDLERS:
        for method, handler in list(handlers.items()):
            if handler is objects.insert:
                monkeypatch.setitem(handlers, method, _failing_at("model.safetensors", handler, uploaded))
    with pytest.raises(StorageError, match="could not write .*model"):
        with folder.staged_dir("model", record="export.json") as staging:
            (staging / "config.json").write_text("{}")
            (staging / "export.json").write_text("second record")
            (staging / "model.safetensors").write_bytes(b"second weights")
    assert uploaded == ["config.json", "model.safetensors"]  # the record was to go last
    assert not folder.exists("model/export.json")
    assert folder.read_bytes("model/model.safetensors") == b"first weights"


def _failing_at(name: str, handler: Callable[..., Any], uploaded: List[str]) -> Callable[..., Any]:
    """An emulator upload handler that answers 403 for the object ``name`` (a call Cloud Storage refuses, which
    gcsfs does not retry), recording each object it was asked for."""
    from http import HTTPStatus

    def refusing(request: Any, response: Any, storage: Any, *args: Any, **kwargs: Any) -> Any:
        asked = (request.query.get("name") or [""])[0] or request.data["meta"]["name"]
        uploaded.append(asked.rsplit("/", 1)[-1])
        if asked.endswith(name):
            response.status = HTTPStatus.FORBIDDEN
            response.json({"error": {"code": 403, "message": "refused by the test"}})
            return None
        return handler(request, response, storage, *args, **kwargs)

    return refusing


def test_a_staged_folder_is_not_copied_where_the_folder_is_local(tmp_path: Path) -> None:
    """The files written into the staging folder are the ones that end in ``model/`` (the same inodes): a
    model of gigabytes is written once, not written then copied."""
    storage = Storage(str(tmp_path / "out"))
    with storage.staged_dir("model") as staging:
        (staging / "model.safetensors").write_bytes(b"weights")
        written = (staging / "model.safetensors").stat().st_ino
    assert (tmp_path / "out" / "model" / "model.safetensors").stat().st_ino == written


KILLED_MID_WRITE = """
import sys, time
from pathlib import Path
from nli.io.storage import Storage

storage = Storage(sys.argv[1])
def write(file):
    file.write(b"half of the results")
    with storage.staged_dir("model") as folder:
        (folder / "model.safetensors").write_bytes(b"half of the weights")
        print("writing", flush=True)
        time.sleep(60)
storage.write_stream("results.json", write)
"""


@pytest.mark.process
def test_what_writers_killed_mid_write_left_is_removed_and_nothing_else(tmp_path: Path) -> None:
    """remove_staging, as a run calls it once it holds its folder: the staging file and folder of writers
    SIGKILLed mid-write go; a user's own hidden or .tmp files, and what is in place, stay."""
    storage = Storage(str(tmp_path / "run"))
    storage.write_text("results.json", "{}")
    mine = [".hidden", "notes.tmp", ".model.tmp", "model.1234.abc.tmp"]
    for name in mine:
        (tmp_path / "run" / name).write_text("the user's")
    writer = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, str(tmp_path / "run")], cwd=ROOT,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert read_line(writer.stdout) == "writing\n"
    finally:
        writer.kill()
        writer.communicate()
    staged = sorted(set(os.listdir(tmp_path / "run")) - {*mine, "results.json"})
    assert [name.split(".")[1] for name in staged] == ["model", "results"]  # .results.json.<pid>.<random>.tmp

    assert storage.remove_staging() == staged
    assert sorted(os.listdir(tmp_path / "run")) == sorted([*mine, "results.json"])
    assert storage.read_bytes("results.json") == b"{}"
    assert storage.remove_staging() == []


def test_the_files_under_a_folder_are_named_at_every_depth_from_the_root(folder: Storage) -> None:
    """What a run's final phase lists to remove an earlier attempt's prediction files (nli.output.results)."""
    for name in ("eval_predictions/validation.jsonl", "eval_predictions/hans/validation.jsonl", "results.json"):
        folder.write_text(name, "{}\n")
    assert folder.files_under("eval_predictions") == ["eval_predictions/hans/validation.jsonl",
                                                      "eval_predictions/validation.jsonl"]
    folder.remove("eval_predictions/hans/validation.jsonl")
    assert folder.files_under("eval_predictions") == ["eval_predictions/validation.jsonl"]
    assert folder.files_under("predictions") == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EROFS])
def test_a_write_the_disk_refused_is_told_wrapped_or_not(code: int) -> None:
    """write_failed: a full disk, a quota or a read-only mount, as raised or inside what was raised from it (the
    StorageError that names the file; Hydra's error around a logger's) or during it; other errors are not one."""
    refused = OSError(code, os.strerror(code))
    assert write_failed(refused)
    try:
        try:
            raise StorageError("could not write x") from refused
        except StorageError as named:
            raise RuntimeError("Error in call to target") from named
    except RuntimeError as wrapped:
        assert write_failed(wrapped)
    try:
        try:
            raise refused
        except OSError:
            raise KeyError("raised while handling it")  # noqa: B904 - the context, not the cause, is the point
    except KeyError as during:
        assert write_failed(during)
    assert not write_failed(OSError(errno.EACCES, "Permission denied")) and not write_failed(ValueError("x"))


def test_a_quota_and_a_read_only_disk_are_said_with_their_fix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(str(tmp_path))
    for code, said in ((errno.EDQUOT, "over your disk quota there: make room within it"),
                       (errno.EROFS, "its file system is read-only: write to a folder on a writable disk")):
        def refuse(*args: Any, code: int = code) -> None:
            raise OSError(code, os.strerror(code))

        monkeypatch.setattr(os, "fsync", refuse)
        with pytest.raises(StorageError, match=f"could not write .*results.json: {re.escape(said)}"):
            storage.write_text("results.json", "{}")


@needs_full
def test_an_append_onto_a_full_disk_is_said_and_the_file_stays_whole(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    storage = Storage(str(tmp_path))
    full(tmp_path / "log.csv")
    with pytest.raises(StorageError, match="could not write .*log.csv: no space left on its disk"):
        storage.append_text("log.csv", "a,b\n")
    storage.write_text("rows.csv", "a,b\n")
    room(monkeypatch, tmp_path / "rows.csv", 3)  # the disk fills 3 bytes into the row
    with pytest.raises(StorageError, match="could not write .*rows.csv: no space left on its disk"):
        storage.append_text("rows.csv", "1,2\n3,4\n")
    assert (tmp_path / "rows.csv").read_text() == "a,b\n"


def test_files_written_together_are_both_replaced_or_neither(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's config.yaml and overrides.yaml: the disk filling as the second is written left the first one new and
    the second the earlier run's (or none), a record of no run."""
    storage = Storage(str(tmp_path))
    storage.write_together({"config.yaml": "lr: 1\n", "overrides.yaml": "- lr=1\n"})
    fsync, calls = os.fsync, []

    def second_fills_the_disk(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        fsync(fd)

    monkeypatch.setattr(os, "fsync", second_fills_the_disk)
    with pytest.raises(StorageError, match="could not write .*overrides.yaml: no space left on its disk"):
        storage.write_together({"config.yaml": "lr: 2\n", "overrides.yaml": "- lr=2\n"})
    assert (tmp_path / "config.yaml").read_text() == "lr: 1\n"
    assert (tmp_path / "overrides.yaml").read_text() == "- lr=1\n"
    assert sorted(os.listdir(tmp_path)) == ["config.yaml", "overrides.yaml"]  # no staging file left
