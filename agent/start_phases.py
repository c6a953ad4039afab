"""How long each part of an engine's start took, for the router's
``pdserve_worker_start_seconds`` (and the cold-start benchmark).

- ``pull``: copying and verifying the weights into the node's cache, as ``pdserve model
  pull`` recorded it beside the model folder (the pod's init container ran it).
- ``weights_load`` and ``engine_warm_up``: vLLM's own figures from this engine's log
  ("Initializing model took", "Loading weights took", "init engine (profile, create kv
  cache, warmup model) took"); ``process_start`` is the rest of the time from spawning
  the engine to its answering (imports, workers, the API server).
- ``engine_start``: the whole of that, where the log cannot be read (a pipe such as
  ``/dev/stdout``; pods keep a file and echo it: ``agent.log_echo``) or names none of
  vLLM's figures (the simulator).
- ``probe``: the agent's prefill probe, the last thing before it registers.
"""

from __future__ import annotations

import re
from pathlib import Path

from modelstore.pull import read_record

_WEIGHTS = re.compile(r"(?:Initializing model|Loading weights) took ([\d.]+) s")
_WARM_UP = re.compile(r"init engine \(profile, create kv cache, warmup model\) took ([\d.]+) s")
_READ_AT_MOST = 4 << 20  # a start's log is a few hundred lines; never read more than this


def log_offset(log_path: Path) -> int:
    """Where the next engine's lines will start in its log (taken before spawning it):
    0 for a log not yet written, -1 for one that cannot be read back (a pipe, a tty)."""
    if not log_path.exists():
        return 0
    try:
        return log_path.stat().st_size if log_path.is_file() else -1
    except OSError:
        return -1


def start_phases(
    *, model_path: Path, log_path: Path, log_from: int, engine_start_s: float, probe_s: float
) -> dict[str, float]:
    phases: dict[str, float] = {}
    record = read_record(model_path)
    if record is not None:
        phases["pull"] = round(record.get("copy_s", 0.0) + record.get("verify_s", 0.0), 3)
    weights, warm_up = _engine_figures(log_path, log_from)
    if weights is None or warm_up is None:
        phases["engine_start"] = round(engine_start_s, 3)
    else:
        phases["process_start"] = round(max(0.0, engine_start_s - weights - warm_up), 3)
        phases["weights_load"], phases["engine_warm_up"] = round(weights, 3), round(warm_up, 3)
    phases["probe"] = round(probe_s, 3)
    return phases


def _engine_figures(log_path: Path, log_from: int) -> tuple[float | None, float | None]:
    """vLLM's weight-load and warm-up seconds in this start's part of the log."""
    if log_from < 0:
        return None, None
    try:
        with log_path.open("rb") as log:
            log.seek(log_from)
            text = log.read(_READ_AT_MOST).decode(errors="replace")
    except OSError:
        return None, None
    weights = [float(s) for s in _WEIGHTS.findall(text)]
    warm_up = _WARM_UP.findall(text)
    return (sum(weights) if weights else None), (float(warm_up[-1]) if warm_up else None)
