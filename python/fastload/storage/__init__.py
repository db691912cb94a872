"""Datasets in object storage (S3, GCS, Azure, HTTP) read through a bounded local cache.

Layer: above ``format`` (it checks downloads against the manifest), below ``loading`` (which opens
the cached copy as a local dataset). Needs the optional extra ``fastload[remote]`` (obstore).
"""

from ._folder import RemoteFile, RemoteFolder
from ._remote import CachedDataset, RemoteSpec, open_remote, remote_splits, reopen_cached
from ._urls import is_remote, redact
from ._window import NeedPlan

__all__ = ["CachedDataset", "NeedPlan", "RemoteFile", "RemoteFolder", "RemoteSpec", "is_remote", "open_remote",
           "redact", "remote_splits", "reopen_cached"]
