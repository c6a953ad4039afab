"""Shared fixtures and tiers.

Tests under tests/real/, and any test parametrised with ``engine="vllm"``, need
real vLLM and carry the ``vllm`` marker. The real tier runs last, and tests marked
``own_engines`` (they start engines of their own) run before the shared real
cluster starts: next to its three engines a fourth takes minutes to load on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

import pytest

pytest_plugins = ["tests.clusters"]

REAL_TIER = Path(__file__).parent / "real"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TIER in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)

    def tier(item: pytest.Item) -> int:
        if item.get_closest_marker("vllm") is None:
            return 0
        return 1 if item.get_closest_marker("own_engines") else 2

    items.sort(key=tier)  # stable: file order holds within a tier
