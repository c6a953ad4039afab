"""Where ``/v1/files`` keeps files: the ``FileStore`` interface and a local directory.

Callers see only the interface, so an S3-compatible store can take the directory's
place without touching them (its ``put`` would be a multipart upload, ``read`` a
ranged GET).

Invariants of ``LocalDirectoryStore``:
- a file exists once its metadata does, and its metadata is written only after its
  bytes are whole: an upload cut short, too large or failed leaves nothing behind (its
  bytes go to a temporary name first, renamed into place);
- at most ``max_files`` files and ``max_file_bytes`` each; a write past either is
  refused (``FileTooLarge``, ``StoreFull``) before anything is kept;
- blocking I/O runs off the event loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import tempfile
from collections.abc import AsyncIterable, AsyncIterator
from pathlib import Path
from typing import Protocol

from contracts.batch import FileObject

_CHUNK_BYTES = 1024 * 1024


class FileTooLarge(ValueError):
    """The file is past ``max_file_bytes``."""


class StoreFull(RuntimeError):
    """The store holds ``max_files`` files already."""


def new_file_id() -> str:
    return "file-" + secrets.token_hex(12)


class FileStore(Protocol):
    async def put(self, meta: FileObject, chunks: AsyncIterable[bytes]) -> FileObject:
        """Keep ``chunks`` under ``meta.id``; the returned record has its ``bytes``."""

    async def get(self, file_id: str) -> FileObject | None: ...

    async def files(self) -> list[FileObject]:
        """Every file's record, oldest first."""

    def read(self, file_id: str) -> AsyncIterator[bytes]:
        """The file's bytes, in chunks; FileNotFoundError when it is gone."""

    async def delete(self, file_id: str) -> bool: ...


class LocalDirectoryStore:
    """Files in one directory: ``<id>.data`` with ``<id>.json`` beside it."""

    def __init__(self, root: Path, *, max_files: int, max_file_bytes: int) -> None:
        self._root = root
        self._max_files = max_files
        self.max_file_bytes = max_file_bytes

    def __repr__(self) -> str:
        return f"LocalDirectoryStore({self._root}, max_files={self._max_files})"

    def _paths(self, file_id: str) -> tuple[Path, Path]:
        if not file_id.replace("-", "").replace("_", "").isalnum():
            raise FileNotFoundError(file_id)  # never a path outside the root
        return self._root / f"{file_id}.data", self._root / f"{file_id}.json"

    async def put(self, meta: FileObject, chunks: AsyncIterable[bytes]) -> FileObject:
        data_path, meta_path = self._paths(meta.id)
        self._root.mkdir(parents=True, exist_ok=True)  # on first use, not at start-up
        if len(list(self._root.glob("*.json"))) >= self._max_files:
            raise StoreFull(f"the file store holds {self._max_files} files, its limit")
        handle, temporary = tempfile.mkstemp(dir=self._root, prefix=".upload-")
        size = 0
        try:
            with os.fdopen(handle, "wb") as out:
                async for chunk in chunks:
                    size += len(chunk)
                    if size > self.max_file_bytes:
                        raise FileTooLarge(
                            f"the file is over {self.max_file_bytes} bytes, the limit"
                        )
                    await asyncio.to_thread(out.write, chunk)
            os.replace(temporary, data_path)
            kept = meta.model_copy(update={"bytes": size})
            await asyncio.to_thread(_write_atomically, meta_path, kept.model_dump_json())
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temporary)
            raise
        return kept

    async def get(self, file_id: str) -> FileObject | None:
        try:
            _, meta_path = self._paths(file_id)
            text = await asyncio.to_thread(meta_path.read_text)
        except FileNotFoundError:
            return None
        return FileObject.model_validate_json(text)

    async def files(self) -> list[FileObject]:
        def read_all() -> list[FileObject]:
            found = []
            for path in self._root.glob("*.json"):
                with contextlib.suppress(FileNotFoundError):
                    found.append(FileObject.model_validate_json(path.read_text()))
            return found

        return sorted(await asyncio.to_thread(read_all), key=lambda f: (f.created_at, f.id))

    async def read(self, file_id: str) -> AsyncIterator[bytes]:
        data_path, meta_path = self._paths(file_id)
        if not meta_path.exists():
            raise FileNotFoundError(file_id)
        with data_path.open("rb") as source:
            while chunk := await asyncio.to_thread(source.read, _CHUNK_BYTES):
                yield chunk

    async def delete(self, file_id: str) -> bool:
        try:
            data_path, meta_path = self._paths(file_id)
            meta_path.unlink()  # first: from here on the file does not exist
        except FileNotFoundError:
            return False
        with contextlib.suppress(FileNotFoundError):
            data_path.unlink()
        return True


def _write_atomically(path: Path, text: str) -> None:
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    temporary.write_text(text)
    os.replace(temporary, path)


async def read_all(store: FileStore, file_id: str) -> bytes:
    return b"".join([chunk async for chunk in store.read(file_id)])
