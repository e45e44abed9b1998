"""Run storage behind one small interface: a local folder or an s3:// prefix.

Built on pyarrow.fs, the filesystem layer Ray Train itself uses for storage_path, so a
custom filesystem (for example an S3FileSystem pointed at a test server) passed to
RunConfig(storage_filesystem=...) is the one checkpoints go through here too.
"""

from __future__ import annotations

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

    def path(self, *parts: str) -> str:
        return posixpath.join(self.root, *parts) if parts else self.root

    def child(self, *parts: str) -> "Storage":
        return Storage(self.fs, self.path(*parts))

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

    def list_files(self, *parts: str) -> list[str]:
        """Relative paths of all files below a folder."""
        return sorted(self.file_sizes(*parts))

    def file_sizes(self, *parts: str) -> dict[str, int]:
        """Relative path -> size in bytes of every file below a folder, as the storage lists them now."""
        if not self.is_dir(*parts):
            return {}
        base = self.path(*parts)
        infos = self.fs.get_file_info(pafs.FileSelector(base, recursive=True))
        return {posixpath.relpath(i.path, base): i.size for i in infos if i.type == pafs.FileType.File}

    def read_bytes(self, *parts: str) -> bytes:
        with self.fs.open_input_stream(self.path(*parts)) as f:
            return f.read()

    def read_text(self, *parts: str) -> str:
        return self.read_bytes(*parts).decode()

    def write_bytes(self, data: bytes, *parts: str) -> None:
        target = self.path(*parts)
        self.fs.create_dir(posixpath.dirname(target), recursive=True)
        with self.fs.open_output_stream(target) as f:
            f.write(data)

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
