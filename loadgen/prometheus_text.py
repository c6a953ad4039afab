"""Read a Prometheus text exposition (vLLM's or the router's): benchmarks and tests."""

from __future__ import annotations

import urllib.request

from prometheus_client.parser import text_string_to_metric_families

Samples = list[tuple[str, dict[str, str], float]]


def scrape(url: str, timeout_s: float = 30) -> Samples:
    with urllib.request.urlopen(url, timeout=timeout_s) as response:
        return parse_text(response.read().decode())


def parse_text(text: str) -> Samples:
    return [
        (sample.name, sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def scrape_or_none(url: str, timeout_s: float = 3) -> Samples | None:
    """``scrape``, or None when the target has no readable /metrics."""
    try:
        return scrape(url, timeout_s)
    except (OSError, ValueError):
        return None


def total(samples: Samples, name: str, **labels: str) -> float:
    """Sum of the samples named ``name`` whose labels include ``labels``."""
    return sum(
        value
        for sample_name, sample_labels, value in samples
        if sample_name == name and labels.items() <= sample_labels.items()
    )
