"""Downloads from the Hugging Face Hub that fail once, early and clearly.

Without a network, ``from_pretrained`` and ``load_dataset`` retry for most of a minute and end in
a stack of connection errors. A one-second probe of the Hub tells first; the error then says what
could not be downloaded and how to run offline.
"""

from __future__ import annotations

import functools
import os
import socket
import urllib.request
from contextlib import contextmanager
from typing import Iterator, Optional
from urllib.parse import urlparse

from nli.errors import HubUnavailableError

OFFLINE_HINT = (
    "To run offline: point model.name_or_path at a local checkpoint directory, data.dir at a "
    "local GLUE directory (glue_data/ with RTE/, MNLI/, ...), load what is already in the Hugging "
    "Face cache with HF_HUB_OFFLINE=1, or try experiment=quickstart (a tiny model on a generated "
    "task, no download)."
)


def _offline_mode(*, dataset: bool = False) -> bool:
    # As huggingface_hub reads it: HF_HUB_OFFLINE, else TRANSFORMERS_OFFLINE, its older name (both set: the first).
    # A dataset as datasets reads it: HF_DATASETS_OFFLINE where set (0 too), else huggingface_hub's. Read here at
    # each call, where the libraries read them once at import.
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or "0"
    if dataset and os.environ.get("HF_DATASETS_OFFLINE") is not None:
        value = os.environ["HF_DATASETS_OFFLINE"]
    return value.lower() in ("1", "true", "yes", "on")


@functools.lru_cache(maxsize=None)
def _reachable(endpoint: str, timeout: float = 3.0) -> bool:
    url = urlparse(endpoint)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co")


def _proxy(endpoint: str) -> Optional[str]:
    """The proxy a download from ``endpoint`` goes through, as the environment names it (HTTPS_PROXY, HTTP_PROXY,
    ALL_PROXY, NO_PROXY), which huggingface_hub's HTTP client honours: where every connection leaves through a
    proxy, the endpoint itself is not reachable, and the proxy is what to probe."""
    url = urlparse(endpoint)
    proxy = urllib.request.getproxies().get(url.scheme) or urllib.request.getproxies().get("all")
    if not proxy or urllib.request.proxy_bypass(url.hostname or ""):
        return None
    return proxy if "://" in proxy else f"http://{proxy}"


@contextmanager
def hub_download(what: str, *, dataset: bool = False, offline: Optional[str] = None) -> Iterator[None]:
    """Wrap a load that may download ``what`` (e.g. "model 'FacebookAI/roberta-base'"; ``dataset``: one that
    ``datasets`` loads, which HF_DATASETS_OFFLINE also keeps to its cache).

    Fails at once when the Hub cannot be reached (unless HF_HUB_OFFLINE=1 asks for the local
    cache only), and turns a failed download into one message with the way to run offline (``offline``, else
    :data:`OFFLINE_HINT`).
    """
    offline = offline or OFFLINE_HINT
    proxy = _proxy(_endpoint())
    if not _offline_mode(dataset=dataset) and not _reachable(proxy or _endpoint()):
        through = f" through the proxy {proxy}" if proxy else ""
        raise HubUnavailableError(f"cannot download {what}: {_endpoint()} is not reachable{through}. {offline}")
    try:
        yield
    except (OSError, ConnectionError) as err:  # what transformers and datasets raise for misses
        raise HubUnavailableError(f"cannot load {what}: {err}. {offline}") from err
