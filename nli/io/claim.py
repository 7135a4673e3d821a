"""One run at a time in an output folder: a claim the run takes before it writes and holds to its end.

Two runs writing one folder would leave one's config.yaml beside the other's model and results, so
a run first creates ``.claim.json`` in the folder (who it is: host, pid, start, a random token, and
a heartbeat), only if no claim is there: locally with ``O_CREAT | O_EXCL``, on Cloud Storage with
the precondition ``ifGenerationMatch=0``. A second run is refused at once, told whose the folder is.

The owner rewrites its heartbeat every ``heartbeat`` seconds from a thread, each time checking that
the claim is still its own (locally the token; on Cloud Storage ``ifGenerationMatch`` of the
generation it wrote last): a claim taken over meanwhile is reported, and ``Claim.lost`` tells the
run to stop writing.

A claim whose owner is gone is taken over, with a warning naming that owner: one whose process no
longer runs on this host (a run SIGKILLed, a container restarted), or whose heartbeat is older than
``stale_after`` (any host). Of two runs taking over at once one wins: locally the stale claim is
first renamed to a name of the taker's own, which only one rename can do, and checked to be the
claim judged stale, before the taker creates its own exclusively; on Cloud Storage the new claim
replaces the stale one only if the object is still that generation.

A lease can be lost by an owner that stops for longer than ``stale_after`` (a paused VM); it is
told at its next heartbeat. The claim is released (deleted, if still its own) when the run ends, by
error or signal too; a run killed outright leaves it to the next run to take over.

A sweep holds its sweep directory the same way, in a claim file of its own (:class:`Use`: the file,
and how the messages name the holder and the fix; nli.sweep.table).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import threading
import time
from dataclasses import asdict, dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from types import TracebackType
from typing import Any, Optional, Protocol, Set, Type

from nli.contract import CLAIM_FILE
from nli.errors import StorageError
from nli.io.storage import TIMEOUT, Storage

log = logging.getLogger(__name__)

HOST = socket.gethostname()
_ATTEMPTS = 5  # rounds of create / read / take over: each lost round means another run moved meanwhile
_HELD: Set[str] = set()  # the tokens of the claims this process holds


@dataclass(frozen=True)
class Use:
    """What a claim holds a folder for, as its file and its messages name it."""

    holder: str  # "run": "in use by another run", "if that run is gone"
    file: str  # the claim's file in the folder
    elsewhere: str  # how to point this one at another folder, in the refusal


RUN = Use("run", CLAIM_FILE, "give this run another output_dir")


class ClaimedError(StorageError):
    """The output folder is claimed by another run that is still alive."""


class ClaimLostError(StorageError):
    """Another run took over this run's claim: this run must not write there any more."""


@dataclass(frozen=True)
class Owner:
    """What a claim says about the run that holds it. Times are seconds since the epoch."""

    host: str
    pid: int
    started: float
    token: str
    heartbeat: float

    @classmethod
    def me(cls) -> "Owner":
        now = time.time()
        return cls(host=HOST, pid=os.getpid(), started=now, token=secrets.token_hex(16), heartbeat=now)

    def encode(self) -> bytes:
        return (json.dumps(asdict(self), indent=1) + "\n").encode()

    @classmethod
    def decode(cls, data: bytes) -> Optional["Owner"]:
        """None for what is not a claim (a file cut short by a crash while it was created)."""
        try:
            owner = cls(**json.loads(data))
        except (ValueError, TypeError):
            return None
        ok = isinstance(owner.pid, int) and owner.pid > 0 and isinstance(owner.heartbeat, (int, float))
        return owner if ok else None

    def describe(self, now: float) -> str:
        return (f"host {self.host}, pid {self.pid}, started {_when(self.started)} "
                f"(heartbeat {now - self.heartbeat:.0f} s ago)")


@dataclass(frozen=True)
class _Seen:
    """A claim as read: its bytes (what a takeover must still find there), its owner where they
    parse, when it was last written, and on Cloud Storage its generation."""

    data: bytes
    owner: Optional[Owner]
    written: float
    generation: Optional[int] = None

    def describe(self, now: float) -> str:
        if self.owner is None:
            return f"a claim that does not say whose it is (written {now - self.written:.0f} s ago)"
        return self.owner.describe(now)


class _Backend(Protocol):
    """The claim file's four operations, each atomic where the folder lives."""

    def create(self, data: bytes) -> bool:
        """Write the claim if there is none; False if there is one."""

    def read(self) -> Optional[_Seen]:
        """The claim, or None if there is none (or it changed while being read)."""

    def displace(self, seen: _Seen, data: bytes) -> bool:
        """Replace the claim ``seen`` with ours; False if it is no longer ``seen`` or another run came first."""

    def refresh(self, token: str, data: bytes) -> bool:
        """Rewrite our claim; False if it is no longer ours."""

    def remove(self, token: str) -> None:
        """Delete our claim, if it is still ours."""


class Claim:
    """This run's exclusive hold on its output folder; a context manager that releases it."""

    def __init__(self, storage: Storage, backend: _Backend, owner: Owner, heartbeat: float, use: Use = RUN) -> None:
        self.storage, self.owner, self.heartbeat, self.use = storage, owner, heartbeat, use
        self._backend = backend
        self._lost: Optional[str] = None  # whose claim replaced ours, once it has
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, name="claim-heartbeat", daemon=True)

    @classmethod
    def take(cls, storage: Storage, *, heartbeat: float = 30.0, stale_after: float = 300.0,
             use: Use = RUN) -> "Claim":
        """Claim ``storage``'s folder for this run (or what ``use`` names), taking over an abandoned
        claim; raise :class:`ClaimedError` at once if a live one holds it. A run's folder, once held, is rid of
        what writers killed mid-write left there (Storage.remove_staging)."""
        if stale_after < 2 * heartbeat:
            raise ValueError(f"stale_after={stale_after} must be at least twice heartbeat={heartbeat}")
        backend, owner = _backend(storage, use.file), Owner.me()
        _HELD.add(owner.token)  # before anyone can read it: this process's other threads must not think it abandoned
        try:
            _acquire(storage, backend, owner, stale_after, use)
            if use is RUN and (left := storage.remove_staging()):  # before the heartbeat writes its own
                log.info("removed what a run stopped mid-write left in %s: %s", storage.describe(), ", ".join(left))
            claim = cls(storage, backend, owner, heartbeat, use)
            claim._thread.start()
        except BaseException as stopped:
            if not isinstance(stopped, Exception):  # a signal's exception after the claim was made: not left behind
                with contextlib.suppress(Exception):
                    backend.remove(owner.token)
            _HELD.discard(owner.token)
            raise
        log.debug("claimed %s (%s)", storage.describe(), storage.describe(use.file))
        return claim

    @property
    def lost(self) -> bool:
        """Whether another run took the claim over: this run must stop writing to the folder."""
        return self._lost is not None

    def check(self) -> None:
        """Raise :class:`ClaimLostError` if the claim was lost (before writing anything that matters)."""
        if self._lost is not None:
            raise ClaimLostError(_lost_message(self.storage, self._lost, self.use))

    def release(self) -> None:
        """Stop the heartbeat and delete the claim if it is still ours. Never raises: it runs while
        another error may be on its way out."""
        if self._stop.is_set():
            return
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * TIMEOUT)
        _HELD.discard(self.owner.token)
        if self._lost is not None:
            return
        try:
            self._backend.remove(self.owner.token)
        except Exception as err:  # a claim left behind is taken over by the next run: warn, go on
            log.warning("could not release the claim %s: %s", self.storage.describe(self.use.file), err)

    def __enter__(self) -> "Claim":
        return self

    def __exit__(self, kind: Optional[Type[BaseException]], error: Optional[BaseException],
                 trace: Optional[TracebackType]) -> None:
        self.release()

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat):
            self.owner = replace(self.owner, heartbeat=time.time())
            try:
                if not self._backend.refresh(self.owner.token, self.owner.encode()):
                    self._lose()
                    return
            except Exception as err:  # a thread's error would end the heartbeat unseen: say it, try again
                log.warning("could not refresh the claim %s (%s); trying again in %.0f s",
                            self.storage.describe(self.use.file), err, self.heartbeat)

    def _lose(self) -> None:
        seen = _quietly_read(self._backend)
        self._lost = seen.describe(time.time()) if seen is not None else "none: the claim was deleted"
        log.error("%s", _lost_message(self.storage, self._lost, self.use))


def _acquire(storage: Storage, backend: _Backend, owner: Owner, stale_after: float, use: Use) -> None:
    """Create the claim, or take over an abandoned one; raise ClaimedError if a live run holds it,
    and StorageError, with the reason, if the folder cannot be claimed at all."""
    try:
        _contend(storage, backend, owner, stale_after, use)
    except StorageError:
        raise
    except Exception as err:
        if storage.cloud:  # google-cloud-storage's errors: a missing bucket, credentials, the network
            raise storage.cloud_failure(err) from err
        if isinstance(err, OSError):
            raise StorageError(f"could not claim {storage.describe()}: {err}") from err
        raise


def _contend(storage: Storage, backend: _Backend, owner: Owner, stale_after: float, use: Use) -> None:
    seen: Optional[_Seen] = None
    for _ in range(_ATTEMPTS):
        if backend.create(owner.encode()):
            return
        seen = backend.read()
        if seen is None:
            continue  # released meanwhile: create it again
        if seen.owner is not None and seen.owner.token == owner.token:
            return  # our own create, retried after its answer was lost, found itself
        why = _abandoned(seen, stale_after)
        if why is None:
            raise ClaimedError(_refusal(storage, seen, use))
        log.warning("%s was claimed by %s, which is gone: %s. Taking it over", storage.describe(),
                    seen.describe(time.time()), why)
        if backend.displace(seen, owner.encode()):
            return
    raise ClaimedError(_refusal(storage, seen, use) if seen else
                       f"{storage.describe()}: other {use.holder}s kept claiming it")


def live_holder(storage: Storage, *, stale_after: float = 300.0, use: Use = RUN) -> Optional[str]:
    """Who holds ``storage``'s claim, described, where that holder may still be alive (a run still writing
    there); None where the folder has no claim, or its holder is gone."""
    seen = _live(storage, stale_after, use)
    return None if seen is None else seen.describe(time.time())


def held_since(storage: Storage, *, stale_after: float = 300.0, use: Use = RUN) -> Optional[float]:
    """When the live holder of ``storage``'s claim took it (its ``started``: a sweep's start, nli.sweep.table);
    None where no live holder says."""
    seen = _live(storage, stale_after, use)
    return None if seen is None or seen.owner is None else seen.owner.started


def _live(storage: Storage, stale_after: float, use: Use) -> Optional[_Seen]:
    if not (storage.local or storage.cloud):
        return None
    seen = _quietly_read(_backend(storage, use.file))
    return None if seen is None or _abandoned(seen, stale_after) is not None else seen


def _abandoned(seen: _Seen, stale_after: float) -> Optional[str]:
    """Why the claim's owner is gone (its process no longer runs on this host, or its heartbeat
    is older than ``stale_after``), or None if it may be alive."""
    owner = seen.owner
    if owner is not None and owner.host == HOST and not _running(owner):
        return f"pid {owner.pid} no longer runs on {HOST}"
    age = time.time() - (owner.heartbeat if owner is not None else seen.written)
    if age > stale_after:
        return f"its last heartbeat was {age:.0f} s ago (stale after {stale_after:.0f} s)"
    return None


def _running(owner: Owner) -> bool:
    if owner.pid == os.getpid():
        # Our own pid: a claim this process holds, or one left by an earlier process that had the
        # same pid (a restarted container numbers its processes alike).
        return owner.token in _HELD
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    return True


def _refusal(storage: Storage, seen: _Seen, use: Use) -> str:
    return (f"{storage.describe()} is in use by another {use.holder}: {seen.describe(time.time())}. Wait for it "
            f"to end, {use.elsewhere}, or, if that {use.holder} is gone, delete {storage.describe(use.file)}")


def _lost_message(storage: Storage, by: str, use: Use) -> str:
    return (f"another {use.holder} took over {storage.describe()} while this {use.holder} was writing to it ({by}); "
            f"this {use.holder} must stop writing there. Check which {use.holder}'s outputs the folder holds")


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _quietly_read(backend: _Backend) -> Optional[_Seen]:
    try:
        return backend.read()
    except Exception:  # only for a message: the claim is lost either way
        return None


def _backend(storage: Storage, file: str) -> _Backend:
    if storage.local:
        return _LocalClaim(storage, file)
    if storage.cloud:
        return _CloudClaim(storage, file)
    raise StorageError(f"{storage.describe()}: a run can claim a local folder or gs:// only")


class _LocalClaim:
    """The claim as a file: created with O_EXCL, rewritten by rename, taken over by renaming it away."""

    def __init__(self, storage: Storage, file: str) -> None:
        self.storage, self.file = storage, file
        self.path = Path(storage.path(file))

    def create(self, data: bytes) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            return False
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
        except BaseException:
            self.path.unlink(missing_ok=True)  # a half-written claim would hold the folder for stale_after
            raise
        return True

    def read(self) -> Optional[_Seen]:
        try:
            data, written = self.path.read_bytes(), self.path.stat().st_mtime
        except FileNotFoundError:
            return None
        return _Seen(data, Owner.decode(data), written)

    def displace(self, seen: _Seen, data: bytes) -> bool:
        # Only one rename can move a given file; the name is ours alone. What it moved must still be
        # the claim judged abandoned: else (another run's new claim, or a heartbeat since) put it back.
        grave = self.path.with_name(f"{self.file}.{os.getpid()}-{secrets.token_hex(4)}.stale")
        try:
            os.rename(self.path, grave)
        except FileNotFoundError:
            return False
        try:
            if grave.read_bytes() != seen.data:
                try:
                    os.link(grave, self.path)
                except FileExistsError:
                    pass  # yet another run claimed it in the instant it was away; the moved one's owner is told
                return False
        finally:
            grave.unlink(missing_ok=True)
        return self.create(data)

    def refresh(self, token: str, data: bytes) -> bool:
        seen = self.read()
        if seen is None or seen.owner is None or seen.owner.token != token:
            return False
        self.storage.write_bytes(self.file, data)  # a temporary file renamed over it: never half a claim
        return True

    def remove(self, token: str) -> None:
        seen = self.read()
        if seen is not None and seen.owner is not None and seen.owner.token == token:
            self.path.unlink(missing_ok=True)


class _CloudClaim:
    """The claim as a Cloud Storage object, every change conditional on its generation
    (``ifGenerationMatch``; 0: that no object exists)."""

    def __init__(self, storage: Storage, file: str) -> None:
        self.blob: Any = storage.blob(file)
        self.generation: Optional[int] = None  # of the claim we wrote last

    def _put(self, data: bytes, if_generation: Optional[int]) -> bool:
        from google.api_core.exceptions import PreconditionFailed

        if if_generation is None:
            return False
        try:
            # Conditional, hence safe to retry: google-cloud-storage retries transient errors itself.
            self.blob.upload_from_string(data, content_type="application/json", if_generation_match=if_generation,
                                         timeout=TIMEOUT)
        except PreconditionFailed:
            return False
        self.generation = int(self.blob.generation)
        return True

    def create(self, data: bytes) -> bool:
        return self._put(data, 0)

    def read(self) -> Optional[_Seen]:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        blob = self.blob.bucket.get_blob(self.blob.name, timeout=TIMEOUT)
        if blob is None:
            return None
        # Taken before the download, which sets them from its response's headers (where an emulator sends none).
        generation, written = int(blob.generation), blob.updated.timestamp()
        try:
            data = blob.download_as_bytes(if_generation_match=generation, timeout=TIMEOUT)
        except (NotFound, PreconditionFailed):
            return None  # replaced or deleted since: the caller reads again
        return _Seen(data, Owner.decode(data), written, generation)

    def displace(self, seen: _Seen, data: bytes) -> bool:
        return self._put(data, seen.generation)

    def refresh(self, token: str, data: bytes) -> bool:
        return self._put(data, self.generation)

    def remove(self, token: str) -> None:
        from google.api_core.exceptions import NotFound, PreconditionFailed

        try:
            self.blob.delete(if_generation_match=self.generation, timeout=TIMEOUT)
        except (NotFound, PreconditionFailed):
            pass  # not ours any more: the run that took it over keeps it
