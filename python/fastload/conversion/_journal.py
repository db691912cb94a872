"""The journal of an unfinished dataset (``.progress.json``): its completed shards, in order, for ``--resume``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..errors import DatasetError
from ..format._manifest import ShardInfo, write_json_atomic
from ._shard_targets import ShardTarget

PROGRESS_NAME = ".progress.json"


class Journal:
    """The progress file of an unfinished dataset: completed shards and where each one ends."""

    def __init__(self, out_dir: Path, fingerprint: str, options: dict[str, Any] | None = None) -> None:
        self.path = out_dir / PROGRESS_NAME
        self.fingerprint = fingerprint
        self.options = options
        self.entries: list[dict[str, Any]] = []
        self.skipped: list[dict[str, Any]] = []
        self.dataset_id: str | None = None  # fixed by the first shard (see _shard_writer.dataset_id)

    def record(self, info: ShardInfo, next_source: int, next_tile: int, skipped: list[dict[str, Any]],
               labels: list[int] | None = None) -> None:
        """Append a completed shard and rewrite the file (``skipped``: the files skipped so far).

        ``labels``: the shard's count per label (``_shard_labels.label_histogram``), or None.
        """
        self.entries.append({**info.to_json(), "next_source": next_source, "next_tile": next_tile,
                             "labels": labels})
        doc = {"fingerprint": self.fingerprint, "options": self.options, "dataset_id": self.dataset_id,
               "shards": self.entries, "skipped": skipped}
        write_json_atomic(self.path, doc)

    def load_valid_prefix(self, target: ShardTarget) -> None:
        """Keep the completed shards that ``target`` still holds whole (in order: up to the first that it does not)."""
        try:
            doc = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as err:
            raise DatasetError(f"{self.path}: unreadable progress file ({err}); start again with --overwrite") from None
        if doc.get("fingerprint") != self.fingerprint:
            raise DatasetError(f"{self.path.parent}: --resume with other options or changed source files than "
                               "the interrupted run (a source file's size or modification time differs, or an "
                               "object's size or ETag, or one was added or removed); restore them, or start again "
                               "with --overwrite")
        for entry in doc["shards"]:
            if target.check(ShardInfo(entry["file"], entry["count"], entry["bytes"], entry["hash"]),
                            thorough=True) is not None:
                break
            self.entries.append(entry)
        if self.entries:
            self.dataset_id = doc.get("dataset_id")
            if not isinstance(self.dataset_id, str):
                raise DatasetError(f"{self.path}: progress file without a dataset id (written by an older "
                                   "fastload); start again with --overwrite")
        position = self.position()
        self.skipped = [s for s in doc.get("skipped", []) if s["index"] < position[0]]

    def position(self) -> tuple[int, int]:
        """Return (source, sample) where the next shard starts."""
        if not self.entries:
            return (0, 0)
        return (self.entries[-1]["next_source"], self.entries[-1]["next_tile"])

    def shards(self) -> list[ShardInfo]:
        """Return the completed shards, as the manifest lists them."""
        return [ShardInfo(e["file"], e["count"], e["bytes"], e["hash"]) for e in self.entries]


def drop_finished_journal(out_dir: Path) -> None:
    """Delete the journal beside a written manifest: a Ctrl-C between writing one and deleting the other left it."""
    (out_dir / PROGRESS_NAME).unlink(missing_ok=True)
