"""The cost model: $/hour per worker kind, from settings.

A worker's kind is what its agent reports (``WorkerRegistration.accelerator``): "cpu",
or its accelerator's name. "default" prices any kind the table does not list.
"""

from __future__ import annotations

import json
import math


def parse_prices(spec: str) -> dict[str, float]:
    """``{"default": 0.1, "nvidia-h100": 2.5}`` -> prices; ValueError naming what is wrong."""
    try:
        raw = json.loads(spec)
    except ValueError as error:
        raise ValueError(f"worker_cost_usd_per_hour is not JSON: {error}") from None
    if not isinstance(raw, dict):
        raise ValueError("worker_cost_usd_per_hour must be a JSON object of kind -> $/hour")
    prices = {}
    for kind, price in raw.items():
        if isinstance(price, bool) or not isinstance(price, int | float):
            raise ValueError(f"worker_cost_usd_per_hour[{kind!r}] must be a number")
        if not math.isfinite(price) or price < 0:
            raise ValueError(f"worker_cost_usd_per_hour[{kind!r}] must be >= 0")
        prices[str(kind)] = float(price)
    return prices


def usd_per_hour(prices: dict[str, float], kind: str) -> float:
    return prices.get(kind, prices.get("default", 0.0))
