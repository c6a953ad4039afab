"""Echo the engine's log file to the agent's stdout, and keep the file bounded.

In a pod the engine's output should reach the container's stdout (``kubectl logs``),
yet the agent reads vLLM's start-up figures from the log file (``agent.start_phases``).
So the engine writes the file, and this task follows it: every new byte is copied to
stdout, and once the file passes ``cap_bytes`` it is emptied (the engine appends with
O_APPEND, so its next line lands at the new start). As logrotate's copytruncate, a line
written between the last read and the truncation is lost; at the default cap that is a
moment every 64 MiB of output.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import BinaryIO

from agent.start_phases import log_offset

CAP_BYTES = 64 << 20
_PIECE = 1 << 16


async def echo_log(
    path: Path, out: BinaryIO, *, cap_bytes: int = CAP_BYTES, interval_s: float = 0.5
) -> None:
    """Follow ``path`` into ``out`` until cancelled, from its end as it is now: what an
    earlier run of the container wrote there was echoed then."""
    offset = max(0, log_offset(path))
    while True:
        offset = await asyncio.to_thread(_copy_new, path, out, offset, cap_bytes)
        await asyncio.sleep(interval_s)


def _copy_new(path: Path, out: BinaryIO, offset: int, cap_bytes: int) -> int:
    """Copy what ``path`` gained since ``offset``; the offset to read from next."""
    try:
        with path.open("rb") as log:
            size = os.fstat(log.fileno()).st_size
            if size < offset:  # emptied by someone else: start over
                offset = 0
            log.seek(offset)
            while piece := log.read(_PIECE):
                out.write(piece)
                offset += len(piece)
            out.flush()
    except FileNotFoundError:
        return 0
    if offset > cap_bytes:
        os.truncate(path, 0)
        return 0
    return offset
