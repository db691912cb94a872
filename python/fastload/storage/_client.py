"""Talking to object storage through obstore: opening a store for a URL, reading objects, typed errors.

obstore (Rust's ``object_store``) is the one storage library: S3, GCS, Azure and HTTP behind one
interface, request signing, credentials from the standard places (``AWS_*`` variables including
``AWS_ENDPOINT_URL``, ``GOOGLE_APPLICATION_CREDENTIALS``, ``AZURE_*``, instance metadata), retries
with backoff and timeouts, all in native code that releases the GIL. It is the optional extra
``fastload[remote]``: local users do not install it.
"""

from __future__ import annotations

import datetime
import os
import random
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ArgumentError, ArgumentTypeError, RemoteError, RemoteNotFoundError
from ._urls import check_dataset_url, join_url, redact, url_secrets

T = TypeVar("T")

# storage_options keys that are not obstore configuration keys but client or retry settings.
_CLIENT_KEYS = {"allow_http", "timeout", "connect_timeout", "allow_invalid_certificates", "proxy_url"}
_RETRY_KEYS = {"max_retries", "retry_timeout_s"}
# retry_timeout_s: the wall-clock budget of one request (a HEAD, a GET, a shard's whole download): a store
# unreachable for a minute (refused connections, 5xx, a restart) is ridden out, one down for good is a
# RemoteError after about this long. max_retries: the most retries of a request; by default the budget ends first.
DEFAULT_RETRIES = {"max_retries": 100, "retry_timeout_s": 120.0}
MAX_RETRIES_LIMIT = 1000
FIRST_BACKOFF_S = 0.5  # the wait after a request's first failure; it doubles after each one after it
MAX_BACKOFF_S = 5.0  # ... up to this (the most a request waits once the store is back); each wait is jittered
# Within each attempt obstore retries at once (a blip: a refused connect, a 5xx, a body broken off, which it
# resumes) at most this many times (and never more than max_retries), within about INNER_RETRY_S.
INNER_RETRIES = 2
INNER_RETRY_S = 2.0
# timeout bounds one whole request, a shard's transfer included: raise it for large shards on a slow link.
DEFAULT_CLIENT = {"connect_timeout": "5s", "timeout": "600s"}
# Words that mark a configuration value as secret (never shown, and scrubbed from any message).
_SECRET_WORDS = ("secret", "token", "password", "key", "sas", "credential", "signature")
_SECRET_ENV = ("AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AZURE_STORAGE_ACCOUNT_KEY", "AZURE_STORAGE_ACCESS_KEY",
               "AZURE_STORAGE_SAS_KEY", "AZURE_STORAGE_SAS_TOKEN", "AZURE_CLIENT_SECRET", "AZURE_STORAGE_TOKEN",
               "GOOGLE_SERVICE_ACCOUNT_KEY")


def _obstore() -> Any:
    try:
        import obstore
    except ImportError:
        raise RemoteError('reading datasets from object storage needs the "remote" extra: '
                          'pip install "fastload[remote]" (obstore)') from None
    return obstore


@dataclass(frozen=True)
class StorageOptions:
    """The options of a remote dataset: obstore configuration, client settings, retries. Its repr hides values."""

    config: Mapping[str, Any] = field(default_factory=dict)
    client: Mapping[str, Any] = field(default_factory=dict)
    retries: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, storage_options: Mapping[str, Any] | None) -> StorageOptions:
        """Split a user's ``storage_options`` into obstore configuration, client and retry settings."""
        if storage_options is None:
            storage_options = {}
        if not isinstance(storage_options, Mapping):
            raise ArgumentTypeError(f"storage_options must be a mapping, not {type(storage_options).__name__}")
        config: dict[str, Any] = {}
        client: dict[str, Any] = dict(DEFAULT_CLIENT)
        retries: dict[str, Any] = dict(DEFAULT_RETRIES)
        for key, value in storage_options.items():
            if not isinstance(key, str):
                raise ArgumentTypeError(f"storage_options keys must be strings, not {type(key).__name__}")
            if key in _CLIENT_KEYS:
                client[key] = value
            elif key in _RETRY_KEYS:
                retries[key] = value
            else:
                config[key] = value
        if "allow_http" not in client and os.environ.get("AWS_ALLOW_HTTP", "").lower() in ("1", "true"):
            client["allow_http"] = True  # object_store reads it from the environment only without client options
        max_retries, timeout = retries["max_retries"], retries["retry_timeout_s"]
        if (isinstance(max_retries, bool) or not isinstance(max_retries, int)
                or not 0 <= max_retries <= MAX_RETRIES_LIMIT):
            raise ArgumentError(f"storage_options max_retries must be an int in [0, {MAX_RETRIES_LIMIT}], not "
                                f"{max_retries!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ArgumentError(f"storage_options retry_timeout_s (seconds a request may be retried) must be in "
                                f"(0, 86400], not {timeout!r}")
        return cls(config, client, retries)

    def secrets(self) -> list[str]:
        """Return the secret values (configured or from the environment) to scrub from any message."""
        found = [str(v) for k, v in self.config.items() if any(w in k.lower() for w in _SECRET_WORDS) and v]
        found += [os.environ[name] for name in _SECRET_ENV if os.environ.get(name)]
        return [s for s in found if len(s) >= 4]

    def __repr__(self) -> str:
        shown = sorted([*self.config, *self.client, *self.retries])
        return f"StorageOptions(keys={shown})"


def scrub(message: str, secrets: list[str]) -> str:
    """Return ``message`` with every secret replaced by ``***``."""
    for secret in secrets:
        message = message.replace(secret, "***")
    return message


class TransientError(RemoteError):
    """A failure that may pass: a refused or dropped connection, a timeout, a body broken off, a 5xx or 429.

    Tried again within the request's budget (``Retries``); never shown once it is spent (``Retries.failed``).
    """


# obstore's first line names the request's URL again ("Error performing GET http://host/key in 1.2s, after 2
# retries, max_retries: 2, retry_timeout: 2s - <reason>"): the message names the URL once, fastload's way.
_PERFORMING = re.compile(r"Error performing [A-Z]+ \S+ in .*? - ")
_URL = re.compile(r"\b[A-Za-z][A-Za-z0-9+.-]*://[^\s,;)]+")
_OS_CAUSE = re.compile(r'message: "([^"\n]{1,200})"')  # the system's reason, in obstore's debug text
_STATUS = re.compile(r"\bstatus(?: code)?:? (\d{3})\b")
_HTTP_KIND = re.compile(r"HttpError \{\s*kind: (\w+)")
# object_store's kinds of HTTP failure that may pass (the others: "Decode", "Unknown", e.g. a refused scheme)
_TRANSIENT_KINDS = {"Connect", "Request", "Timeout", "Interrupted"}
_JITTER = random.SystemRandom()  # the same in no two processes (forked workers would share a seeded Random's)


def is_transient(err: BaseException) -> bool:
    """Return whether a failure of obstore may pass: connection, timeout, broken body, an answer 5xx, 408 or 429.

    A 4xx answer (404 missing, 403 refused, 400) and a configuration error are not.
    """
    if isinstance(err, (TimeoutError, ConnectionError)):
        return True
    text = str(err)
    status = _STATUS.search(text)
    if status is not None:
        code = int(status.group(1))
        return code >= 500 or code in (408, 429)
    kind = _HTTP_KIND.search(text)
    return kind is not None and kind.group(1) in _TRANSIENT_KINDS


class Retries:
    """The attempts of one request: exponential backoff with jitter, within ``max_retries`` and a wall-clock budget.

    The clock starts when it is made (before the first attempt). After a transient failure ``wait``
    sleeps before the next attempt (0.5 s, doubling up to 5 s, each a random 50 to 100 % of that) and
    says whether there is one: no attempt starts later than ``retry_timeout_s`` after the first.
    """

    def __init__(self, retries: Mapping[str, Any]) -> None:
        """``retries``: ``StorageOptions.retries``."""
        self.most = int(retries["max_retries"]) + 1
        self.budget = float(retries["retry_timeout_s"])
        self.started = time.monotonic()
        self.tries = 0  # failed attempts so far

    def elapsed(self) -> float:
        """Return the seconds since the first attempt began."""
        return time.monotonic() - self.started

    def wait(self, stop: threading.Event | None = None) -> bool:
        """Count a failed attempt and wait before the next; return False when none is left or ``stop`` is set.

        With ``stop`` the wait ends as soon as it is set (a closed fetcher, a Ctrl-C); without it, it
        is a plain sleep (in the main thread a Ctrl-C interrupts it).
        """
        self.tries += 1
        left = self.budget - self.elapsed()
        if self.tries >= self.most or left <= 0 or (stop is not None and stop.is_set()):
            return False
        backoff = min(MAX_BACKOFF_S, FIRST_BACKOFF_S * 2.0 ** min(self.tries - 1, 30))
        pause = min(left, backoff * _JITTER.uniform(0.5, 1.0))
        if stop is None:
            time.sleep(pause)
            return True
        return not stop.wait(pause)

    def failed(self, err: RemoteError) -> RemoteError:
        """Return the error to raise once no attempt is left: the last failure, how many attempts, how long."""
        times = "time" if self.tries == 1 else "times"
        return RemoteError(f"{err} (tried {self.tries} {times} over {self.elapsed():.1f} s)")


class RemoteRoot:
    """A dataset location in object storage: its URL and an obstore store whose prefix is that location."""

    def __init__(self, url: str, options: StorageOptions) -> None:
        check_dataset_url(url)
        self.url = url.rstrip("/")
        self.options = options
        self._secrets = options.secrets() + url_secrets(url)
        obstore = _obstore()
        from obstore.store import from_url

        # obstore's own retries are the quick ones within one attempt; Retries rides out an outage.
        inner_s = min(INNER_RETRY_S, float(options.retries["retry_timeout_s"]))
        retry = {"max_retries": min(INNER_RETRIES, options.retries["max_retries"]),
                 "retry_timeout": datetime.timedelta(seconds=inner_s),
                 "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                             "max_backoff": datetime.timedelta(seconds=1), "base": 2.0}}
        try:
            self.store = from_url(self.url, config=dict(options.config) or None,  # type: ignore[call-overload]
                                  client_options=dict(options.client), retry_config=retry)
        except obstore.exceptions.UnknownConfigurationKeyError as err:
            raise ArgumentError(f"{redact(self.url)}: storage_options: {scrub(str(err), self._secrets)}") from None
        except Exception as err:  # obstore's errors about the URL or the configuration
            raise RemoteError(f"{redact(self.url)}: cannot open: {self._message(err)}") from None

    def url_of(self, relpath: str) -> str:
        """Return the URL of ``relpath`` under this location, for messages: the location redacted, the key as it is.

        Only the location is redacted: a key may hold ``#`` or ``?``, which redacting the whole URL
        would cut off, naming another object.
        """
        return join_url(redact(self.url), relpath)

    def _message(self, err: BaseException) -> str:
        """Return why ``err`` failed, in one line: no URL (the caller names it once), no secret."""
        text = scrub(str(err), self._secrets)
        if not text.strip():
            return type(err).__name__
        reason = _URL.sub("<url>", _PERFORMING.sub("", text.splitlines()[0])).strip().rstrip(":").strip()
        cause = _OS_CAUSE.search(text)  # e.g. "Connection refused", which obstore's first line leaves out
        if cause is not None and cause.group(1).lower() not in reason.lower():
            reason = f"{reason}: {cause.group(1)}"
        return reason[:500]

    def call(self, relpath: str, what: str, fn: Callable[[], T], retry: bool = True,
             stop: threading.Event | None = None) -> T:
        """Run ``fn`` (an obstore call on ``relpath``), turning its errors into typed ones naming the URL once.

        A transient failure (``is_transient``) is tried again with backoff within the budget
        (``Retries``; ``stop`` ends the waits), then raised as a RemoteError saying how many attempts
        and how long; with ``retry=False`` it is raised at once as a TransientError (the caller
        retries a larger unit: a shard's download). A missing object (RemoteNotFoundError) and a
        refused permission are never retried.
        """
        retries = Retries(self.options.retries)
        while True:
            try:
                return self._once(relpath, what, fn)
            except TransientError as err:
                if not retry:
                    raise
                if not retries.wait(stop):
                    raise retries.failed(err) from None

    def _once(self, relpath: str, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` once, its errors typed: RemoteNotFoundError, TransientError, else RemoteError."""
        obstore = _obstore()
        where = self.url_of(relpath)
        try:
            return fn()
        except (FileNotFoundError, obstore.exceptions.NotFoundError) as err:
            raise RemoteNotFoundError(f"{where}: not found ({what}): {self._message(err)}") from None
        except (PermissionError, obstore.exceptions.PermissionDeniedError,
                obstore.exceptions.UnauthenticatedError) as err:
            raise RemoteError(f"{where}: refused ({what}): {self._message(err)}") from None
        except Exception as err:  # obstore's errors, and plain exceptions for some transport failures
            if isinstance(err, (RemoteError, ArgumentError)):
                raise
            known = isinstance(err, (obstore.exceptions.BaseError, OSError))
            reason = self._message(err) if known else f"{type(err).__name__}: {self._message(err)}"
            kind = TransientError if is_transient(err) else RemoteError
            raise kind(f"{where}: {what} failed: {reason}") from None

    def read_bytes(self, relpath: str, limit: int) -> bytes:
        """Return the whole object ``relpath``; refuse one larger than ``limit`` bytes, holding no more of it.

        One request: the size the answer's header gives is checked before the body is read, and the
        body is read in pieces, given up as soon as it runs past ``limit`` (a server may send a longer
        body than its header said, e.g. chunked with a ``Content-Length``).
        """
        obstore = _obstore()

        def get() -> bytes:
            result = obstore.get(self.store, relpath)
            size = int(result.meta["size"])
            if size > limit:
                raise RemoteError(f"{self.url_of(relpath)}: {size} bytes, more than the {limit} a file of its kind "
                                  f"may have")
            data = bytearray()
            for chunk in result.stream(min_chunk_size=1 << 20):
                data += memoryview(chunk)
                if len(data) > limit:
                    raise RemoteError(f"{self.url_of(relpath)}: more than {limit} bytes (the answer said {size})")
            return bytes(data)

        return self.call(relpath, "GET", get)

    def exists(self, relpath: str) -> bool:
        """Return whether the object ``relpath`` exists (other failures raise)."""
        try:
            self.size(relpath)
        except RemoteNotFoundError:
            return False
        return True

    def size(self, relpath: str) -> int:
        """Return the size in bytes of the object ``relpath``."""
        obstore = _obstore()
        meta = self.call(relpath, "HEAD", lambda: obstore.head(self.store, relpath))
        return int(meta["size"])

    def stream(self, relpath: str, retry: bool = True) -> Iterator[memoryview]:
        """Yield the object ``relpath`` in chunks, as the server sends it (errors typed, naming the URL).

        Each chunk is a read-only view of obstore's buffer (at least 8 MiB but the last): not copied.
        ``retry``: the request is tried again within the budget until its body starts; a body that
        breaks off later (after obstore's own resumptions) is a TransientError. With ``retry=False``
        a failed request is one at once too (``fetch_shard`` downloads again from the start).
        """
        obstore = _obstore()
        result = self.call(relpath, "GET", lambda: obstore.get(self.store, relpath), retry=retry)
        chunks = iter(result.stream(min_chunk_size=8 << 20))
        while True:
            chunk = self.call(relpath, "GET (body)", lambda: next(chunks, None), retry=False)
            if chunk is None:
                return
            yield memoryview(chunk)

    def __repr__(self) -> str:
        return f"RemoteRoot({redact(self.url)!r})"
