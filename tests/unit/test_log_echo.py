"""``agent.log_echo``: the engine's log reaches stdout whole, and the file stays bounded."""

from __future__ import annotations

import asyncio
import io
from pathlib import Path

from agent.log_echo import echo_log


async def test_new_lines_are_echoed_and_a_full_file_is_emptied(tmp_path: Path):
    log, out = tmp_path / "engine.log", io.BytesIO()
    task = asyncio.create_task(echo_log(log, out, cap_bytes=100, interval_s=0.01))
    try:
        await asyncio.sleep(0.05)  # no file yet: nothing to echo, no error
        with log.open("ab") as engine:  # the engine appends, as it does
            engine.write(b"first line\n")
            engine.flush()
            await _until(lambda: out.getvalue() == b"first line\n")
            engine.write(b"x" * 120 + b"\n")  # past the cap
            engine.flush()
            await _until(lambda: log.stat().st_size == 0)
            engine.write(b"after the cap\n")  # O_APPEND: lands at the new start
            engine.flush()
            await _until(lambda: out.getvalue().endswith(b"after the cap\n"))
    finally:
        task.cancel()
    assert out.getvalue() == b"first line\n" + b"x" * 120 + b"\nafter the cap\n"
    assert log.read_bytes() == b"after the cap\n"


async def _until(check, timeout_s: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)
