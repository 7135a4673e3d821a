"""A run's output directory, on local disk or ``gs://bucket/prefix``, through fsspec.

Every write is all-or-nothing. A local file is written to a temporary name of its own (two writers
never share one), flushed to disk and renamed; a Cloud Storage object only appears once its upload
completes. What spans several files (a checkpoint) marks its completion with a file of its own,
written last (nli/train/checkpoint.py). Local files and folders get the modes the user's umask gives, as
any tool's would.

On Cloud Storage the credentials are decided once, up front (``google.auth.default()``), and handed
to gcsfs and google-cloud-storage: left to itself, gcsfs tries one way after another, probing for a
metadata server and retrying a host it cannot resolve, and answers a machine without credentials
after about a minute with a traceback about DNS. What fails is said in one line, with the fix.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import posixpath
import re
import secrets
import shutil
import tempfile
from functools import cached_property
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, BinaryIO, Callable, Dict, Iterator, List, Optional, Tuple

import fsspec
from fsspec.core import split_protocol
from fsspec.implementations.local import LocalFileSystem

from nli.errors import StorageError

if TYPE_CHECKING:
    from google.auth.credentials import Credentials

_CLOUD = ("gs", "gcs")
_SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_EMULATOR = "STORAGE_EMULATOR_HOST"  # google-cloud-storage and gcsfs both talk to it when set
TIMEOUT = 10.0  # seconds for one Cloud Storage request that decides whether a run can start


# The errors that say the disk itself will take no more: full, over the user's quota, mounted read-only.
FULL = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


def write_failed(error: BaseException) -> bool:
    """Whether ``error`` is a write the disk refused (:data:`FULL`: no space, over quota, read-only), itself or an
    error it was raised from or during (a StorageError, a library's own error wrapping the OSError)."""
    return write_refusal(error) is not None


def write_refusal(error: BaseException) -> Optional[str]:
    """What the disk said to the write ``error`` is or wraps (:func:`write_failed`), with the fix, as the run's
    messages say it; None where it is no such write."""
    seen: set[int] = set()
    each: Optional[BaseException] = error
    while each is not None and id(each) not in seen:
        seen.add(id(each))
        if isinstance(each, OSError) and each.errno in FULL:
            return _reason(each)
        each = each.__cause__ or each.__context__
    return None


def file_in_the_way(path: Path) -> Optional[Path]:
    """The file that stands where the folder ``path``, or a folder above it, would be; None where there is none."""
    return next((each for each in (path, *path.parents) if each.exists() and not each.is_dir()), None)


class Storage:
    """Files under one root directory, named by ``/``-separated paths relative to it. ``key`` is
    the setting that named the directory, for messages (``output_dir``, ``train.checkpoint_dir``)."""

    def __init__(self, url: str, *, key: str = "output_dir") -> None:
        self.url, self.key = url.rstrip("/"), key
        protocol = split_protocol(self.url)[0] or "file"
        self._fs_class = fsspec.get_filesystem_class(protocol)
        self.root: str = self._fs_class._strip_protocol(self.url)
        self.local = issubclass(self._fs_class, LocalFileSystem)
        self.cloud = protocol in _CLOUD

    @cached_property
    def fs(self) -> fsspec.AbstractFileSystem:
        """The filesystem, made on first use: on Cloud Storage that is when the credentials are
        found or found missing (a StorageError)."""
        if not self.cloud:
            return self._fs_class()
        credentials, project = self._google
        # "anon" is gcsfs's own word for what an emulator needs.
        token: Any = "anon" if os.environ.get(_EMULATOR) else credentials
        return self._fs_class(token=token, **({"project": project} if project else {}))

    @cached_property
    def _google(self) -> Tuple["Credentials", Optional[str]]:
        return _credentials(f"{self.key}={self.url}")

    @cached_property
    def _client(self) -> Any:
        import google.cloud.storage as gcs  # type: ignore[import-untyped]  # ships no types

        credentials, project = self._google
        return gcs.Client(project=project, credentials=credentials)  # project=None: infer none, probe nothing

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts)

    def describe(self, *parts: str) -> str:
        """The full location, as a user would type it (gs://bucket/prefix/file)."""
        return posixpath.join(self.url, *parts)

    def absolute(self) -> str:
        """The location as one place however a command typed it: a local path made absolute, through its links (a
        relative output_dir, or one through a symbolic link, is the same folder as its real path)."""
        return os.path.realpath(self.root) if self.local else self.describe()

    def blob(self, name: str) -> Any:
        """The ``google.cloud.storage.Blob`` of ``name`` (Cloud Storage only), for what gcsfs cannot
        do: conditional writes on an object's generation (nli.io.claim)."""
        assert self.cloud, f"{self.url} is not on Cloud Storage"
        bucket, _, prefix = self.root.partition("/")
        return self._client.bucket(bucket).blob(posixpath.join(prefix, name))

    def check_writable(self) -> None:
        """Fail now, with the reason, rather than at the first checkpoint an hour in."""
        probe = f".write-test-{os.getpid()}-{secrets.token_hex(4)}"  # two runs starting at once probe apart
        if self.cloud:
            self._check_cloud(probe)
            return
        # A file in the way reads as a raw errno below ("File exists", "Not a directory").
        if self.local and (blocker := file_in_the_way(Path(self.root).absolute())) is not None:
            raise StorageError(f"{self.key}={self.url}: {blocker} is a file, not a folder. Set {self.key} to a folder")
        try:
            self.write_bytes(probe, b"ok")
            self.fs.rm(self.path(probe))
        except OSError as err:
            raise StorageError(f"{self.key}={self.url} is not writable: {_reason(err)}") from err

    def _check_cloud(self, probe: str) -> None:
        """One small upload and its deletion, without retries: a missing bucket or credentials that
        may not write answer at once, and a network that is down within TIMEOUT."""
        blob = self.blob(probe)
        try:
            blob.upload_from_string(b"ok", timeout=TIMEOUT, retry=None)
            blob.delete(timeout=TIMEOUT, retry=None)
        except Exception as err:  # google-api-core's, google-auth's and requests' errors, told apart below
            raise self.cloud_failure(err) from err

    def check_readable(self) -> bool:
        """Whether anything is under the directory. On Cloud Storage one listing, without retries: a wrong
        bucket, credentials that may not read or no network are a StorageError at once, with the fix (gcsfs
        would retry for a minute, logging each try's traceback)."""
        if not self.cloud:
            return bool(self.fs.exists(self.root))
        return bool(self.blobs(limit=1))

    def blobs(self, *, limit: Optional[int] = None) -> List[Any]:
        """The ``google.cloud.storage.Blob`` of every object under the directory (Cloud Storage only), with
        its size and generation, in one listing without retries: a wrong bucket, credentials that may not
        read or no network are a StorageError at once, with the fix."""
        assert self.cloud, f"{self.url} is not on Cloud Storage"
        bucket, _, prefix = self.root.partition("/")
        try:
            return list(self._client.list_blobs(bucket, prefix=f"{prefix}/" if prefix else None, max_results=limit,
                                                timeout=TIMEOUT, retry=None))
        except Exception as err:  # google-api-core's, google-auth's and requests' errors, told apart below
            raise self.read_failure(err) from err

    def read_failure(self, err: BaseException) -> StorageError:
        """What a Cloud Storage error met while reading this directory means, and its fix (cloud_failure's
        are about a directory written to, whose bucket one may create)."""
        from google.api_core import exceptions as api

        bucket = self.root.partition("/")[0]
        if isinstance(err, api.NotFound):
            return StorageError(f"{self.key}={self.url}: bucket {bucket} does not exist: check the URL "
                                "(gcloud storage ls lists your buckets)")
        if isinstance(err, api.Forbidden):
            return StorageError(f"{self.key}={self.url}: reading gs://{bucket} is not allowed: grant "
                                "roles/storage.objectViewer on the bucket, or use other credentials")
        return self.cloud_failure(err)

    def cloud_failure(self, err: BaseException) -> StorageError:
        """What a Cloud Storage error means for this directory, and its fix."""
        return _cloud_failure(err, f"{self.key}={self.url}", self.root.partition("/")[0], self._google[0])

    def write_bytes(self, name: str, data: bytes) -> None:
        path = self.path(name)
        try:
            if self.local:
                _write_local_atomically(Path(path), lambda file: file.write(data))
            else:
                self.fs.pipe_file(path, data)  # an object is visible only once fully uploaded
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    def write_stream(self, name: str, write: Callable[[BinaryIO], object]) -> None:
        """``name``, as ``write`` writes it into an open file, whole or not at all, as write_bytes: for what
        is too large to hold in memory twice (a checkpoint). On Cloud Storage, written to a local file first,
        then uploaded (an object is visible only once fully uploaded)."""
        path = self.path(name)
        try:
            if self.local:
                _write_local_atomically(Path(path), write)
            else:
                with tempfile.TemporaryDirectory() as folder:
                    staging = Path(folder) / "upload"
                    with open(staging, "wb") as file:
                        write(file)
                    self.fs.put_file(str(staging), path)
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    def write_text(self, name: str, text: str) -> None:
        self.write_bytes(name, text.encode())

    def write_together(self, files: Dict[str, str]) -> None:
        """Files that say one thing together (a run's config.yaml and overrides.yaml), each as write_text writes it,
        and none replaced unless every one was written: locally each is staged whole before any is renamed into
        place (a rename takes no space), so a full disk leaves the files as they were. On Cloud Storage each is
        uploaded in turn (an upload fails for want of a bucket or a right, both said before the first)."""
        if not self.local:
            for name, text in files.items():
                self.write_text(name, text)
            return
        staged: Dict[str, Path] = {}
        try:
            for name, text in files.items():
                try:
                    staged[name] = _stage_local(Path(self.path(name)), functools.partial(_write_all, text.encode()))
                except OSError as err:
                    raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err
            for name, staging in list(staged.items()):
                os.replace(staging, self.path(name))
                del staged[name]
        finally:
            for staging in staged.values():
                staging.unlink(missing_ok=True)

    def append_text(self, name: str, text: str) -> None:
        """``text`` added at the end of ``name`` (made where there is none), whole or not at all: a write the disk
        stops part-way (full) is cut back to where the file ended, so that a file of lines never ends in half of
        one. On Cloud Storage, where an object cannot grow, the object is written again with ``text`` at its end."""
        path = self.path(name)
        try:
            if self.local:
                _append_local(Path(path), text.encode())
            else:
                earlier = self.fs.cat_file(path) if self.fs.exists(path) else b""
                self.fs.pipe_file(path, earlier + text.encode())
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    def read_bytes(self, name: str) -> bytes:
        return self.fs.cat_file(self.path(name))

    def read_json(self, name: str) -> Optional[Any]:
        """The JSON file's content; None where there is no such file."""
        try:
            return json.loads(self.read_bytes(name))
        except FileNotFoundError:
            return None

    def exists(self, name: str) -> bool:
        return self.fs.exists(self.path(name))

    def list(self, name: str) -> List[str]:
        """Names of the entries directly under ``name`` (none if it does not exist)."""
        if not self.fs.isdir(self.path(name)):
            return []
        return sorted(posixpath.basename(p.rstrip("/")) for p in self.fs.ls(self.path(name), detail=False))

    def files_under(self, name: str) -> List[str]:
        """Paths (relative to the root) of every file under ``name``, at any depth (none if it does not exist)."""
        if not self.fs.isdir(self.path(name)):
            return []
        prefix = self.path(name).rstrip("/") + "/"
        return sorted(posixpath.join(name, found[len(prefix):]) for found in self.fs.find(self.path(name))
                      if found.startswith(prefix))

    def remove(self, name: str) -> None:
        if self.fs.exists(self.path(name)):
            self.fs.rm(self.path(name), recursive=True)

    def upload_dir(self, local: Path, name: str) -> None:
        """Copy the files of a local directory to ``name``, replacing what was there. Locally the
        directory is swapped in whole; on Cloud Storage each file is replaced as it uploads."""
        try:
            if self.local:
                with _staged_local_dir(Path(self.path(name))) as staging:
                    _copy_files(local, staging)
            else:
                self._upload_files(local, name)
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    @contextlib.contextmanager
    def staged_dir(self, name: str, *, record: Optional[str] = None) -> Iterator[Path]:
        """A local folder to write ``name``'s files into, which becomes ``name`` when the block ends without an
        error, as upload_dir would copy it, but with no copy where the folder is local: the staging folder
        beside ``name`` is swapped in (a model of gigabytes is written once). On Cloud Storage, a temporary
        folder uploaded file by file (:meth:`_upload_staged`), ``record`` (the file that vouches for the others:
        an export's export.json) last. An error leaves what was there before and no staging folder."""
        try:
            if self.local:
                with _staged_local_dir(Path(self.path(name))) as staging:
                    yield staging
            else:
                with tempfile.TemporaryDirectory() as folder:
                    yield Path(folder)
                    self._upload_staged(Path(folder), name, record)
        except OSError as err:
            raise StorageError(f"could not write {self.describe(name)}: {_reason(err)}") from err

    def _upload_staged(self, local: Path, name: str, record: Optional[str]) -> None:
        """``local``'s files uploaded to ``name`` as the folder it becomes. No object store swaps a folder in whole:
        the old ``record`` goes first and the new one is uploaded last, so that an upload cut short (a lost machine,
        a failed call) leaves a folder without its record, which its reader refuses as damaged, not an old record
        beside new files; then the old folder's files the new one lacks go, as a local folder swapped in drops them."""
        if record is not None:
            self.remove(posixpath.join(name, record))
        files = sorted((p for p in local.rglob("*") if p.is_file()),
                       key=lambda p: (p.relative_to(local).as_posix() == record, p.as_posix()))
        for file in files:
            self.fs.put_file(str(file), self.path(name, file.relative_to(local).as_posix()))
        kept = {posixpath.join(name, file.relative_to(local).as_posix()) for file in files}
        for stale in set(self.files_under(name)) - kept:
            self.fs.rm(self.path(stale))

    def _upload_files(self, local: Path, name: str) -> None:
        for file in sorted(p for p in local.rglob("*") if p.is_file()):
            self.fs.put_file(str(file), self.path(name, file.relative_to(local).as_posix()))

    def remove_staging(self) -> List[str]:
        """What writers stopped mid-write (SIGKILL, a machine lost) left at the folder's top level: the staging
        files and folders this module names for their writer (``.<name>.<pid>.<random>.tmp``) that were never
        renamed into place, an export's gigabytes among them. Only for a folder this process holds (nli.io.claim):
        another live writer's staging would be in use. On Cloud Storage there are none (an object appears whole,
        and staging is local). Returns their names."""
        root = Path(self.path())
        if not self.local or not root.is_dir():
            return []
        left = sorted(entry.name for entry in root.iterdir() if _STAGING.match(entry.name))
        for name in left:
            path = root / name
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
        return left

    @contextlib.contextmanager
    def local_file(self, name: str) -> Iterator[Path]:
        """A path on this machine holding ``name``: the file itself where the folder is local, else a download
        of it, deleted afterwards (FileNotFoundError where there is no such file)."""
        if self.local:
            yield Path(self.path(name))
            return
        with tempfile.TemporaryDirectory() as folder:
            copy = Path(folder) / posixpath.basename(name)
            self.fs.get_file(self.path(name), str(copy))
            yield copy

    def download_dir(self, name: str, local: Path) -> None:
        """Copy the files under ``name`` into the local directory ``local``, by their paths there."""
        root = self.path(name)
        try:
            for remote in sorted(self.fs.find(root)):
                target = local / posixpath.relpath(remote, root)
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(remote, str(target))
        except OSError as err:
            raise StorageError(f"could not read {self.describe(name)}: {_reason(err)}") from err


def digest(f: IO[bytes]) -> Tuple[int, str]:
    """The size and SHA-256 of what ``f`` holds, read in blocks: a model or a checkpoint (gigabytes) is never
    whole in memory. What a checkpoint's manifest and an export's export.json record of each file."""
    sha, size = hashlib.sha256(), 0
    while block := f.read(1 << 20):
        sha.update(block)
        size += len(block)
    return size, sha.hexdigest()


def _reason(err: OSError) -> str:
    if isinstance(err, FileNotFoundError) and not isinstance(err, StorageError):
        return f"{err} (does the bucket or parent directory exist?)"
    if err.errno == errno.ENOSPC:
        return "no space left on its disk: make room there and run the same command again (what was saved is kept)"
    if err.errno == errno.EDQUOT:
        return ("over your disk quota there: make room within it (or raise it) and run the same command again (what "
                "was saved is kept)")
    if err.errno == errno.EROFS:
        return "its file system is read-only: write to a folder on a writable disk"
    return str(err)


def _credentials(where: str) -> Tuple["Credentials", Optional[str]]:
    """Google's application default credentials and their project, or a StorageError saying that
    there are none and how to get some. An emulator needs none."""
    import google.auth
    from google.auth.credentials import AnonymousCredentials
    from google.auth.exceptions import DefaultCredentialsError

    if os.environ.get(_EMULATOR):
        return AnonymousCredentials(), None
    try:
        return google.auth.default(scopes=[_SCOPE])
    except DefaultCredentialsError as err:
        named = os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
        fix = (f"point GOOGLE_APPLICATION_CREDENTIALS (now {named}) at a service account key file" if named else
               "set GOOGLE_APPLICATION_CREDENTIALS to a service account key file")
        raise StorageError(f"{where}: no usable Google Cloud credentials ({_said(err)}). "
                           f"Run `gcloud auth application-default login`, or {fix}") from err


def _cloud_failure(err: BaseException, where: str, bucket: str, credentials: "Credentials") -> StorageError:
    import requests
    from google.api_core import exceptions as api
    from google.auth import exceptions as auth

    if isinstance(err, StorageError):
        return err
    who = _who(credentials)
    relogin = "run `gcloud auth application-default login`, or set GOOGLE_APPLICATION_CREDENTIALS to a valid key file"
    if isinstance(err, api.NotFound):
        return StorageError(f"{where}: bucket {bucket} does not exist (create it: gcloud storage buckets create "
                            f"gs://{bucket})")
    if isinstance(err, (api.Unauthorized, auth.RefreshError)):
        return StorageError(f"{where}: Google refused {who} ({_said(err)}): {relogin}")
    if isinstance(err, api.Forbidden):
        return StorageError(f"{where}: {who} may not write to gs://{bucket} ({_said(err)}): grant "
                            "roles/storage.objectAdmin on the bucket, or use other credentials")
    if isinstance(err, (requests.ConnectionError, requests.Timeout, auth.TransportError)):
        return StorageError(f"{where}: cannot reach Cloud Storage ({_said(err)}); check the network")
    return StorageError(f"{where}: Cloud Storage failed: {_said(err)}")


def _who(credentials: "Credentials") -> str:
    """Whose credentials a message is about, as far as they say."""
    from google.auth.credentials import AnonymousCredentials

    if isinstance(credentials, AnonymousCredentials):
        return f"anonymous access ({_EMULATOR}={os.environ.get(_EMULATOR)})"
    if getattr(credentials, "service_account_email", None):
        return f"the service account {credentials.service_account_email}"  # type: ignore[attr-defined]
    if getattr(credentials, "account", None):
        return f"the account {credentials.account}"  # type: ignore[attr-defined]
    return "the application default credentials"


def _said(err: BaseException) -> str:
    """What the error says, on one line: google-api-core's message, or google-auth's text and cause
    (whose str() would be the repr of a tuple)."""
    message = _server_message(err) or getattr(err, "message", None)
    if not message:
        message = ": ".join(str(arg) for arg in err.args if isinstance(arg, (str, BaseException)))
    return " ".join(str(message or type(err).__name__).split())


def _server_message(err: BaseException) -> Optional[str]:
    """Cloud Storage's own words from an error response's JSON body; google-api-core's message
    wraps them in the request's URL and the response's repr."""
    try:
        return str(err.response.json()["error"]["message"])  # type: ignore[attr-defined]
    except (AttributeError, ValueError, KeyError, TypeError):
        return None


def umask() -> int:
    """The process's umask, read without changing it where Linux tells it (os.umask can only set
    it, and a file another thread creates meanwhile would get the wrong mode)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# The staging names of _write_local_atomically and _staged_local_dir (and _swap_in's retired folder).
_STAGING = re.compile(r"^\..+\.\d+\.[a-z0-9_]+\.tmp(\.old)?$")


def _write_local_atomically(path: Path, write: Callable[[BinaryIO], object]) -> None:
    staging = _stage_local(path, write)
    try:
        os.replace(staging, path)
    except BaseException:
        staging.unlink(missing_ok=True)
        raise


def _stage_local(path: Path, write: Callable[[BinaryIO], object]) -> Path:
    """``path``'s new content, as ``write`` writes it, in a staging file beside it, on disk: the file to rename into
    place. A write that fails leaves no staging file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # A name of this writer's own: two writers of one file must not write into each other's staging.
    fd, staging = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.{os.getpid()}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())  # on disk before the rename makes it visible
            os.fchmod(f.fileno(), 0o666 & ~umask())  # mkstemp makes it 0600; a file others may read, as open() would
    except BaseException:
        Path(staging).unlink(missing_ok=True)  # a full disk (or Ctrl-C) must not also leave half a file behind
        raise
    return Path(staging)


def _write_all(data: bytes, file: BinaryIO) -> None:
    file.write(data)


def _append_local(path: Path, data: bytes) -> None:
    """``data`` at the end of ``path``, written unbuffered so that a failure is known where it happened: the file is
    then cut back to its length before (a device that cannot be cut, /dev/full, is left as it is)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.lseek(fd, 0, os.SEEK_END)
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view):]  # a write may take part of it, and the next fail
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


@contextlib.contextmanager
def _staged_local_dir(target: Path) -> Iterator[Path]:
    """A folder beside ``target`` to fill, swapped in when the block ends: a crash keeps the previous one.
    The staging and retired folders are named for this writer alone."""
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.{os.getpid()}.", suffix=".tmp"))
    try:
        yield staging
        _set_modes(staging)
        _swap_in(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _copy_files(source: Path, target: Path) -> None:
    """``source``'s files and folders into ``target``, stopping at the first that fails, with its own error
    (copytree copies on past a failure and reports every file's, without their errno: a full disk's)."""
    for path in sorted(source.rglob("*")):  # a folder before what it holds
        copy = target / path.relative_to(source)
        if path.is_dir():
            copy.mkdir(exist_ok=True)
        else:
            shutil.copy2(path, copy)


def _set_modes(folder: Path) -> None:
    """The modes a fresh folder and files would have: copytree keeps the source's (a temporary
    directory's 0700, a 0600 file written through mkstemp), which would keep the model from others."""
    mask = umask()
    modes: Dict[bool, int] = {True: 0o777 & ~mask, False: 0o666 & ~mask}
    folder.chmod(modes[True])
    for path in folder.rglob("*"):
        if not path.is_symlink():
            path.chmod(modes[path.is_dir()])


def _swap_in(staging: Path, target: Path) -> None:
    """Move ``target`` aside and ``staging`` into its place. Another writer may swap its own in
    between: the rename then meets a folder again, and the next round moves that one aside too."""
    retired = staging.with_name(staging.name + ".old")
    for _ in range(10):
        with contextlib.suppress(FileNotFoundError):  # nothing there yet, or another writer moved it aside
            os.replace(target, retired)
        try:
            os.replace(staging, target)
        except OSError:
            if target.is_dir():  # another writer's folder came in between
                shutil.rmtree(retired, ignore_errors=True)
                continue
            if retired.is_dir():
                os.replace(retired, target)  # keep the previous one
            raise
        shutil.rmtree(retired, ignore_errors=True)
        return
    raise StorageError(f"could not move {staging} to {target}: other writers kept replacing it")
