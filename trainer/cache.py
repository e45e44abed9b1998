"""The per-node cache: each model and dataset fetched, and each dataset tokenized, once per node.

Every rank may ask; a file lock makes the first one on a node do the work and the others reuse
it. Under --cache-dir (else TRAINER_CACHE, else ~/.cache/trainer): `models/` (hub and s3://
models), `hub/` (huggingface_hub's own cache), `datasets-s3/` (s3:// datasets), `datasets/`
(the `datasets` library's cache), `data/` (packed rows), `hashes/`, `locks/`. A download lands in
a `.tmp` sibling and is renamed into place with its `.complete` marker, so one cut short is done
again and never read.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Callable

MARKER = ".complete"


def default_dir() -> str:
    return os.environ.get("TRAINER_CACHE") or str(Path.home() / ".cache" / "trainer")


def key(text: str, n: int = 16) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def lock(cache_dir: str | Path, name: str):
    """The node-wide lock of one cache entry (a file lock: ranks are processes)."""
    from filelock import FileLock

    folder = Path(cache_dir) / "locks"
    folder.mkdir(parents=True, exist_ok=True)
    return FileLock(str(folder / f"{name}.lock"))


def is_complete(target: Path) -> bool:
    return (target / MARKER).is_file()


def fill(target: Path, download: Callable[[Path], None], marker: str) -> Path:
    """`download(folder)` into a fresh `.tmp` sibling of `target`, then renamed into place, marker included."""
    tmp = target.with_name(target.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    download(tmp)
    tmp.mkdir(parents=True, exist_ok=True)
    (tmp / MARKER).write_text(marker)
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)
    return target
