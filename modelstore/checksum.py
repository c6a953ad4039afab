"""A model folder's checksum, as the model registry records it (``sha256:<hex>``)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def folder_files(folder: Path) -> list[tuple[str, Path]]:
    """(name the checksum hashes, path) of each file, in the checksum's order: a folder's
    files by relative path, or a single file by its name."""
    if folder.is_file():
        return [(folder.name, folder)]
    return [(str(p.relative_to(folder)), p) for p in sorted(folder.rglob("*")) if p.is_file()]


def folder_checksum(folder: Path) -> str:
    """sha256 over each file's relative path and contents, in path order: the same folder
    gives the same checksum on any host."""
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist: pass a checksum for a remote artifact")
    digest = hashlib.sha256()
    for name, path in folder_files(folder):
        digest.update(name.encode())
        with path.open("rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"
