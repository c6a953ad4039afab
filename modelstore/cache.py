"""Where prepared models live, and the atomic publish step every builder shares."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path


def cache_root() -> Path:
    """``$PDSERVE_CACHE_DIR`` or ``~/.cache/pdserve``."""
    return Path(os.environ.get("PDSERVE_CACHE_DIR", Path.home() / ".cache" / "pdserve"))


def prepared(
    name: str, build: Callable[[Path], None], *, what: str, progress: Callable[[str], None]
) -> Path:
    """Return the cached model folder ``name``, building it first if absent.

    The build writes into a temporary sibling that is renamed into place only
    when complete, so an interrupted build never leaves a half model behind.
    """
    target = cache_root() / "models" / name
    if (target / "config.json").exists():
        progress(f"model {name}: cached at {target}")
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    progress(f"model {name}: {what}")
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
    try:
        build(staging)
        staging.chmod(0o755)
        if target.exists():
            shutil.rmtree(target)
        staging.rename(target)
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    progress(f"model {name}: ready at {target}")
    return target
