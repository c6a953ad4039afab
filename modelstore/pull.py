"""Pull a registered model version from an artifact store into a node's cache, verified.

A pulled version lives at ``CACHE/<model>/<version>``, whole or not at all: files are
copied into a hidden sibling and hashed as they pass, the checksum must equal the
registry's, and only then is the copy renamed into place. Two pods pulling the same
version at once both finish: the second rename finds the first one's folder, verifies
it, and drops its own copy. A folder already in place is verified, never trusted (a
cache can rot or be tampered with); one that fails is replaced.

The store is a folder (a mounted volume); an object store (``s3://``, ``hf://``) is
refused with a clear error until it has a reader here. How long each part took comes
back in ``Pulled``: the cold-start benchmark and the agent's start-up metrics use it.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from modelstore.checksum import folder_checksum, folder_files

# Files are copied in pieces this size, so progress shows on a large file too.
_PIECE = 8 << 20


def record_path(version_folder: Path) -> Path:
    """Where a pull leaves its timings: beside the version's folder, not in it (a file
    inside would change the folder's checksum). The agent reads it (``start_phases``)."""
    return version_folder.with_name(f".{version_folder.name}.pull.json")


def read_record(version_folder: Path) -> dict | None:
    try:
        return json.loads(record_path(version_folder).read_text())
    except (OSError, ValueError):
        return None


def pulled_versions(version_folder: Path) -> tuple[str, ...]:
    """The versions pulled beside ``version_folder`` (the same model, the same cache),
    each with its folder and record; () for a folder a pull did not place."""
    if read_record(version_folder) is None:
        return ()
    found = []
    for record in sorted(version_folder.parent.glob(".*.pull.json"))[:32]:
        version = record.name[1 : -len(".pull.json")]
        if (version_folder.parent / version).is_dir():
            found.append(version)
    return tuple(found)


class PullError(RuntimeError):
    """The version cannot be pulled as asked: no such source, or a checksum mismatch."""


@dataclass(frozen=True, slots=True)
class Pulled:
    path: Path
    cached: bool  # already in the cache (verified), nothing copied
    bytes_copied: int
    copy_s: float
    verify_s: float


def pull(
    source: str, *, model: str, version: str, checksum: str, cache: Path,
    progress: Callable[[str], None] = print,
) -> Pulled:  # fmt: skip
    """Make ``cache/model/version`` a verified copy of ``source``."""
    target = cache / model / version
    if target.exists():
        started = time.monotonic()
        if folder_checksum(target) == checksum:
            progress(f"{model} {version}: cached at {target}, checksum verified")
            return _recorded(Pulled(target, True, 0, 0.0, time.monotonic() - started))
        progress(f"{model} {version}: the cached copy fails its checksum; pulling it again")
        shutil.rmtree(target)
    folder = _local_folder(source)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}-", dir=target.parent))
    try:
        started = time.monotonic()
        copied, got = _copy(
            folder, staging, progress=lambda line: progress(f"{model} {version}: {line}")
        )
        copy_s, verify_s = time.monotonic() - started, 0.0  # hashed as it was copied
        if got != checksum:
            raise PullError(
                f"{model} {version}: {source} has checksum {got}, the registry says {checksum}"
            )
        staging.chmod(0o755)
        try:
            staging.rename(target)
        except OSError:
            if not (target.exists() and folder_checksum(target) == checksum):
                raise
            progress(f"{model} {version}: pulled by another pod meanwhile; keeping that copy")
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    progress(f"{model} {version}: {copied / 1e6:.1f} MB copied and verified in "
             f"{copy_s:.1f} s, at {target}")  # fmt: skip
    return _recorded(Pulled(target, False, copied, copy_s, verify_s))


def _recorded(pulled: Pulled) -> Pulled:
    record = {"cached": pulled.cached, "bytes_copied": pulled.bytes_copied,
              "copy_s": round(pulled.copy_s, 3), "verify_s": round(pulled.verify_s, 3),
              "at_unix_s": round(time.time(), 3)}  # fmt: skip
    temporary = record_path(pulled.path).with_suffix(f".{secrets.token_hex(4)}.tmp")
    temporary.write_text(json.dumps(record))
    os.replace(temporary, record_path(pulled.path))
    return pulled


def _local_folder(source: str) -> Path:
    if "://" in source and not source.startswith("file://"):
        scheme = source.split("://", 1)[0]
        raise PullError(f"{source}: {scheme}:// stores are not readable yet; mount the "
                        "store as a folder and register that path")  # fmt: skip
    folder = Path(source.removeprefix("file://"))
    if not folder.exists():
        raise PullError(f"{folder}: no such artifact in the store")
    return folder


def _copy(source: Path, into: Path, progress: Callable[[str], None]) -> tuple[int, str]:
    """Copy a folder's files (or one file) into ``into``, hashing them as they pass
    (``folder_checksum``'s digest: the copy is not read a second time); the bytes copied
    and the checksum. A line of progress at most every 2 seconds."""
    files = folder_files(source)
    total = sum(path.stat().st_size for _, path in files)
    digest, copied, shown = hashlib.sha256(), 0, time.monotonic()
    for name, path in files:
        digest.update(name.encode())
        destination = into / name
        destination.parent.mkdir(parents=True, exist_ok=True)
        with path.open("rb") as reader, destination.open("wb") as writer:
            for piece in iter(lambda reader=reader: reader.read(_PIECE), b""):
                writer.write(piece)
                digest.update(piece)
                copied += len(piece)
                if time.monotonic() - shown > 2:
                    shown = time.monotonic()
                    progress(f"{copied / 1e6:.0f} / {total / 1e6:.0f} MB")
            os.fsync(writer.fileno())
    return copied, f"sha256:{digest.hexdigest()}"
