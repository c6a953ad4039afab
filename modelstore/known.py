"""Model names pdserve prepares itself, and the folders they resolve to."""

from __future__ import annotations

from pathlib import Path

from modelstore import minilm, smollm2, tiny_llama

KNOWN = {"smollm2": smollm2, "tiny": tiny_llama, "minilm": minilm}


def resolve(name_or_path: str) -> tuple[Path, str]:
    """(model folder, served model name) for a known name or a model folder."""
    module = KNOWN.get(name_or_path)
    if module is not None:
        return module.ensure(), module.SERVED_NAME
    path = Path(name_or_path).expanduser()
    if not (path / "config.json").exists():
        raise SystemExit(
            f"{name_or_path}: not a known model ({', '.join(KNOWN)}) nor a model folder"
        )
    return path, path.name
