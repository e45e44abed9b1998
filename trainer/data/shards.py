"""Packed rows on disk as shards: one folder per chunk of records, meta.json written last.

    <root>/shard-00000/{input_ids,labels,position_ids,real_tokens}.npy
    <root>/shard-00001/...
    <root>/meta.json        counts, drop reasons, the source's fingerprint, `shards`: rows per shard

A folder without meta.json is unfinished and never read. The same layout serves the per-node
cache (`<cache>/data/<key>`) and the run storage (`<storage-path>/_data/<key>`, the stack's
bucket on EKS), from which a node downloads the shards once into its cache.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from trainer.storage import Storage

COLUMNS = ("input_ids", "labels", "position_ids", "real_tokens")
META = "meta.json"
DATA_DIR = "_data"  # under the run storage: the shards every run of the same data and packing shares


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def write_shard(storage: Storage, index: int, arrays: dict[str, np.ndarray]) -> int:
    """One chunk's packed rows, each column as a .npy file; returns the bytes written."""
    written = 0
    for name in COLUMNS:
        buf = io.BytesIO()
        np.save(buf, arrays[name])
        storage.write_bytes(buf.getvalue(), shard_name(index), f"{name}.npy")
        written += buf.tell()
    return written


def write_meta(storage: Storage, meta: dict) -> None:
    """Last: its presence says every shard it counts is written."""
    storage.write_text(json.dumps(meta, indent=1), META)


def read_meta(storage: Storage) -> dict | None:
    """The finished preparation's meta, or None (nothing there, or not finished)."""
    if not storage.exists(META):
        return None
    return json.loads(storage.read_text(META))


class Rows:
    """The shards' columns as one table of rows, memory-mapped; `take` reads the rows asked for."""

    def __init__(self, folder: Path, counts: list[int]):
        self.maps = {name: [np.load(folder / shard_name(i) / f"{name}.npy", mmap_mode="r") for i in range(len(counts))]
                     for name in COLUMNS}
        self.offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self.num_rows = int(self.offsets[-1])
        self.real_tokens = np.concatenate([np.asarray(m) for m in self.maps["real_tokens"]]) if counts else \
            np.zeros(0, np.int32)

    def take(self, name: str, rows: np.ndarray) -> np.ndarray:
        """The rows (global indices) of one column, in the order asked."""
        rows = np.asarray(rows, np.int64)
        first = self.maps[name][0]
        out = np.empty((len(rows),) + first.shape[1:], first.dtype)
        shard = np.searchsorted(self.offsets, rows, side="right") - 1
        for s in np.unique(shard):
            at = shard == s
            out[at] = self.maps[name][s][rows[at] - self.offsets[s]]
        return out

    def column(self, name: str) -> np.ndarray:
        """A whole column (in memory when there are several shards): for inspection and tests, not the loop."""
        parts = self.maps[name]
        return parts[0] if len(parts) == 1 else np.concatenate(parts)
