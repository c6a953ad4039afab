"""A model folder's checksum, as the model registry records it (``sha256:<hex>``)."""

from __future__ import annotations

import hashlib
from pathlib import Path


def folder_checksum(folder: Path) -> str:
    """sha256 over each file's relative path and contents, in path order: the same folder
    gives the same checksum on any host."""
    if not folder.exists():
        raise FileNotFoundError(f"{folder} does not exist: pass a checksum for a remote artifact")
    digest = hashlib.sha256()
    files = [folder] if folder.is_file() else sorted(p for p in folder.rglob("*") if p.is_file())
    for path in files:
        digest.update(str(path.relative_to(folder) if path != folder else path.name).encode())
        with path.open("rb") as data:
            for block in iter(lambda: data.read(1 << 20), b""):
                digest.update(block)
    return f"sha256:{digest.hexdigest()}"
