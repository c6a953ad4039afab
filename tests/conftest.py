"""Shared fixtures. Tests under tests/real/ need real vLLM and carry the ``vllm`` marker."""

from __future__ import annotations

from pathlib import Path

import pytest

REAL_TIER = Path(__file__).parent / "real"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if REAL_TIER in Path(item.fspath).parents:
            item.add_marker(pytest.mark.vllm)
