"""Dataset URLs: which paths are remote, joining keys onto them, and showing them without secrets."""

from __future__ import annotations

import os
from urllib.parse import urlsplit, urlunsplit

from ..errors import ArgumentError, DatasetError

# The schemes obstore's from_url understands that fastload accepts as dataset locations.
REMOTE_SCHEMES = ("s3", "s3a", "gs", "az", "abfs", "abfss", "adl", "azure", "http", "https")


def is_remote(path: object) -> bool:
    """Return whether ``path`` is a URL of object storage (``s3://``, ``gs://``, ``az://``, ``https://``...)."""
    if isinstance(path, os.PathLike) or not isinstance(path, str):
        return False
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.lower() in REMOTE_SCHEMES


def join_url(url: str, relpath: str) -> str:
    """Return ``url`` with the relative, '/'-separated ``relpath`` appended (no '..', no absolute part)."""
    parts = [p for p in relpath.split("/") if p not in ("", ".")]
    if any(p == ".." for p in parts) or relpath.startswith("/"):
        raise DatasetError(f"{redact(url)}: {relpath[:80]!r} leaves the dataset")
    return url.rstrip("/") + "/" + "/".join(parts)


def redact(url: str) -> str:
    """Return ``url`` without user information or query (where presigned URLs and SAS tokens put secrets)."""
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
        if parts.port is not None:
            host = f"{host}:{parts.port}"
    except ValueError:
        return "<unparsable URL>"
    return urlunsplit((parts.scheme, host, parts.path, "", ""))


def check_dataset_url(url: str) -> None:
    """Refuse a dataset URL with user information, a query or a fragment (credentials go in storage_options)."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 (parses it: raises ValueError when it is not a number)
    except ValueError as err:
        raise ArgumentError(f"{redact(url)}: not a valid URL ({err})") from None
    if parts.username is not None or parts.password is not None or parts.query or parts.fragment:
        raise ArgumentError(f"{redact(url)}: a dataset URL takes no user, password, query or fragment; pass "
                            f"credentials and tokens in storage_options (they are never shown)")


def url_secrets(url: str) -> list[str]:
    """Return the parts of ``url`` that may be secret: the password and every query value (SAS, signatures)."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return []
    found = [parts.password or ""] + [v for _, _, v in (p.partition("=") for p in parts.query.split("&"))]
    return [s for s in found if len(s) >= 4]
