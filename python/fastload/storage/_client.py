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
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from ..errors import ArgumentError, ArgumentTypeError, RemoteError, RemoteNotFoundError
from ._urls import check_dataset_url, join_url, redact, url_secrets

T = TypeVar("T")

# storage_options keys that are not obstore configuration keys but client or retry settings.
_CLIENT_KEYS = {"allow_http", "timeout", "connect_timeout", "allow_invalid_certificates", "proxy_url"}
_RETRY_KEYS = {"max_retries", "retry_timeout_s"}
# Bounded by default: a server that dies gives an error within about this long, not obstore's 3 minutes.
DEFAULT_RETRIES = {"max_retries": 4, "retry_timeout_s": 30.0}
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
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or not 0 <= max_retries <= 100:
            raise ArgumentError(f"storage_options max_retries must be an int in [0, 100], not {max_retries!r}")
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 86400:
            raise ArgumentError(f"storage_options retry_timeout_s must be in (0, 86400], not {timeout!r}")
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


class RemoteRoot:
    """A dataset location in object storage: its URL and an obstore store whose prefix is that location."""

    def __init__(self, url: str, options: StorageOptions) -> None:
        check_dataset_url(url)
        self.url = url.rstrip("/")
        self.options = options
        self._secrets = options.secrets() + url_secrets(url)
        obstore = _obstore()
        from obstore.store import from_url

        retry = {"max_retries": options.retries["max_retries"],
                 "retry_timeout": datetime.timedelta(seconds=float(options.retries["retry_timeout_s"])),
                 "backoff": {"init_backoff": datetime.timedelta(milliseconds=100),
                             "max_backoff": datetime.timedelta(seconds=5), "base": 2.0}}
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
        return scrub(str(err), self._secrets).splitlines()[0][:500] if str(err) else type(err).__name__

    def call(self, relpath: str, what: str, fn: Callable[[], T]) -> T:
        """Run ``fn`` (an obstore call on ``relpath``), turning its errors into typed ones naming the URL."""
        obstore = _obstore()
        where = self.url_of(relpath)
        try:
            return fn()
        except (FileNotFoundError, obstore.exceptions.NotFoundError) as err:
            raise RemoteNotFoundError(f"{where}: not found ({what}): {self._message(err)}") from None
        except (PermissionError, obstore.exceptions.PermissionDeniedError,
                obstore.exceptions.UnauthenticatedError) as err:
            raise RemoteError(f"{where}: refused ({what}): {self._message(err)}") from None
        except (obstore.exceptions.BaseError, OSError, TimeoutError, ConnectionError) as err:
            raise RemoteError(f"{where}: {what} failed after the retries: {self._message(err)}") from None
        except Exception as err:  # obstore raises plain exceptions for some transport failures
            if isinstance(err, (RemoteError, ArgumentError)):
                raise
            raise RemoteError(f"{where}: {what} failed: {type(err).__name__}: {self._message(err)}") from None

    def read_bytes(self, relpath: str, limit: int) -> bytes:
        """Return the whole object ``relpath``; refuse one larger than ``limit`` bytes before reading it."""
        obstore = _obstore()
        size = self.size(relpath)
        if size > limit:
            raise RemoteError(f"{self.url_of(relpath)}: {size} bytes, more than the {limit} a file of its kind "
                              f"may have")
        data = self.call(relpath, "GET", lambda: bytes(obstore.get(self.store, relpath).bytes()))
        if len(data) > limit:
            raise RemoteError(f"{self.url_of(relpath)}: {len(data)} bytes, more than {limit}")
        return data

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

    def stream(self, relpath: str) -> Iterator[memoryview]:
        """Yield the object ``relpath`` in chunks, as the server sends it (errors typed, naming the URL).

        Each chunk is a read-only view of obstore's buffer (at least 8 MiB but the last): not copied.
        """
        obstore = _obstore()
        result = self.call(relpath, "GET", lambda: obstore.get(self.store, relpath))
        chunks = iter(result.stream(min_chunk_size=8 << 20))
        while True:
            chunk = self.call(relpath, "GET (body)", lambda: next(chunks, None))
            if chunk is None:
                return
            yield memoryview(chunk)

    def __repr__(self) -> str:
        return f"RemoteRoot({redact(self.url)!r})"
