"""Run storage behind one small interface: a local folder or an s3:// prefix.

Built on pyarrow.fs, the filesystem layer Ray Train itself uses for storage_path, so a
custom filesystem (for example an S3FileSystem pointed at a test server) passed to
RunConfig(storage_filesystem=...) is the one checkpoints go through here too.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
from dataclasses import dataclass
from pathlib import Path

import pyarrow.fs as pafs


@dataclass(frozen=True)
class Storage:
    """A filesystem plus a root path on it; every method takes paths relative to root."""

    fs: pafs.FileSystem
    root: str

    @classmethod
    def from_uri(cls, uri: str, fs: pafs.FileSystem | None = None) -> "Storage":
        if fs is not None:
            return cls(fs, uri.split("://", 1)[-1].rstrip("/"))
        if "://" not in uri:
            return cls(pafs.LocalFileSystem(), str(Path(uri).expanduser().absolute()))
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return cls(filesystem, path.rstrip("/"))

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    def parent(self) -> "Storage":
        """The folder above root, on the same filesystem (a run folder's: the storage path)."""
        return Storage(self.fs, posixpath.dirname(self.root))

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def exists(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type != pafs.FileType.NotFound

    def is_dir(self, *parts: str) -> bool:
        return self.fs.get_file_info(self.path(*parts)).type == pafs.FileType.Directory

    def list_dirs(self, *parts: str) -> list[str]:
        """Names of the immediate sub-folders (empty if the folder does not exist)."""
        if not self.is_dir(*parts):
            return []
        infos = self.fs.get_file_info(pafs.FileSelector(self.path(*parts), recursive=False))
        return sorted(i.base_name for i in infos if i.type == pafs.FileType.Directory)

    def file_sizes(self, *parts: str) -> dict[str, int]:
        """Relative path -> size in bytes of every file below a folder, as the storage lists them now."""
        if not self.is_dir(*parts):
            return {}
        base = self.path(*parts)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return {posixpath.relpath(i.path, base): i.size for i in infos if i.type == pafs.FileType.File}

    def read_bytes(self, *parts: str) -> bytes:
        """The object's bytes as stored (pyarrow would gunzip a .gz name by default: compression=None)."""
        with self.fs.open_input_stream(self.path(*parts), compression=None) as f:
            return f.read()

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode()

    def write_bytes(self, data: bytes, *parts: str) -> None:
        """The file whole or not at all: locally a temporary file, synced, then renamed over the target (a full
        disk or a crash leaves the previous content); an object store's PUT is atomic already."""
        target = self.path(*parts)
        self.fs.create_dir(posixpath.dirname(target), recursive=True)
        if not self.is_local:
            with self.fs.open_output_stream(target, compression=None) as f:  # the bytes as given, whatever the name
                f.write(data)
            return
        tmp = f"{target}.tmp-{os.getpid()}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise

    def write_text(self, text: str, *parts: str) -> None:
        self.write_bytes(text.encode(), *parts)

    def upload_dir(self, local_dir: str | os.PathLike, *parts: str) -> None:
        """Copy a local folder's files into this storage (merging with what is there)."""
        self.fs.create_dir(self.path(*parts), recursive=True)
        pafs.copy_files(str(Path(local_dir).absolute()), self.path(*parts),
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)

    def upload_file(self, local_file: str | os.PathLike, *parts: str) -> None:
        target = self.path(*parts)
        self.fs.create_dir(posixpath.dirname(target), recursive=True)
        pafs.copy_files(str(Path(local_file).absolute()), target,
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=self.fs)

    def download_dir(self, local_dir: str | os.PathLike, *parts: str) -> None:
        Path(local_dir).mkdir(parents=True, exist_ok=True)
        pafs.copy_files(self.path(*parts), str(Path(local_dir).absolute()),
                        source_filesystem=self.fs, destination_filesystem=pafs.LocalFileSystem())

    def delete_dir(self, *parts: str) -> None:
        if self.is_dir(*parts):
            self.fs.delete_dir(self.path(*parts))

    def delete_file(self, *parts: str) -> None:
        if self.exists(*parts):
            self.fs.delete_file(self.path(*parts))


def location_problem(uri: str, fs: pafs.FileSystem | None = None) -> str | None:
    """Why a run folder cannot be written (None when it can), found without writing anything that stays.

    Local: the folder, or its nearest existing parent, must be a folder this process can
    create entries in (tried with a temporary folder, removed at once). s3://: the bucket
    must answer (exist, and the credentials reach it).
    """
    import tempfile

    from facts.errors import first_line

    if "://" in uri and not uri.startswith("file://"):
        store = Storage.from_uri(uri, fs=fs)
        bucket = store.root.split("/", 1)[0]
        try:
            if store.fs.get_file_info(bucket).type == pafs.FileType.NotFound:
                return f"the bucket {bucket} does not exist (or is not visible to these credentials)"
            store.fs.get_file_info(store.root)
        except Exception as e:  # noqa: BLE001 - pyarrow raises OSError subclasses with the AWS error inside
            return f"the bucket {bucket} does not answer ({first_line(e)}); check the bucket name and the credentials"
        return None
    path = Path(uri.removeprefix("file://")).expanduser().absolute()
    if path.exists() and not path.is_dir():
        return f"{path} is a file, not a folder"
    parent = path
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        return f"{parent} is a file, so no folder can be made below it"
    try:
        os.rmdir(tempfile.mkdtemp(prefix=".trainer-write-check-", dir=parent))
    except OSError as e:
        return f"cannot create folders in {parent} ({first_line(e)}); choose a folder you can write"
    return None
