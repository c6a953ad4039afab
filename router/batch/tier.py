"""What the HTTP layer holds of the batch tier: the file store, the batch book and the
caps the API enforces (the runner is started beside the app, ``runner.py``)."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from router.batch.book import BatchBook
from router.batch.file_store import FileStore, LocalDirectoryStore
from router.settings import BatchSettings
from router.state.base import ControlState


@dataclass(frozen=True, slots=True)
class BatchTier:
    files: FileStore
    book: BatchBook
    settings: BatchSettings


def build_batch_tier(settings: BatchSettings, state: ControlState) -> BatchTier:
    files = LocalDirectoryStore(Path(settings.files_dir), max_files=settings.max_files,
                                max_file_bytes=settings.max_file_bytes)  # fmt: skip
    book = BatchBook(state, max_batches=settings.max_batches, wall_clock=time.time)
    return BatchTier(files=files, book=book, settings=settings)
