"""When each request is sent: open-loop arrival processes.

- ``poisson``: exponential gaps at ``rate`` (vLLM bench's default);
- ``gamma``: gamma-distributed gaps with mean 1/rate and shape ``burstiness``
  (vLLM bench's meaning: 1 is Poisson, below 1 burstier, above 1 more regular);
- ``constant``: exactly 1/rate apart;
- ``trace``: the dataset's own timestamps (divided by a speed-up factor).
Seeded, so a run can be repeated request for request.
"""

from __future__ import annotations

import random

ARRIVALS = ("poisson", "gamma", "constant", "trace")


def send_times(
    count: int, *, process: str, rate: float, burstiness: float = 1.0, seed: int = 0
) -> list[float]:
    """Seconds after the start at which each of ``count`` requests is sent."""
    if process not in ("poisson", "gamma", "constant"):
        raise ValueError(f"arrival process {process!r} needs no rate; known: {ARRIVALS}")
    if rate <= 0:
        raise ValueError("rate must be positive (requests per second)")
    if burstiness <= 0:
        raise ValueError("burstiness must be positive")
    rng = random.Random(seed)
    times: list[float] = []
    now = 0.0
    for _ in range(count):
        times.append(now)
        if process == "constant":
            now += 1 / rate
        elif process == "poisson":
            now += rng.expovariate(rate)
        else:
            now += rng.gammavariate(burstiness, 1 / (rate * burstiness))
    return times
