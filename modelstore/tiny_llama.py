"""A tiny random-weight Llama with an offline-trained tokenizer: the test model.

Random weights are enough for protocol and equality tests: greedy decoding is
still deterministic, and the model is small enough that vLLM starts fast on CPU.
"""

from __future__ import annotations

import json
import sysconfig
from collections.abc import Callable, Iterator
from pathlib import Path

from modelstore.cache import prepared

NAME = "tiny-llama-v1"
SERVED_NAME = "tiny-llama"
VOCAB_SIZE = 4096
MAX_POSITIONS = 4096
SPECIAL_TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
_TRAINING_FILES = 300


def _stdlib_text() -> Iterator[str]:
    """Deterministic local training text: the first Python stdlib sources, sorted."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))[:_TRAINING_FILES]
    for path in files:
        yield path.read_text(encoding="utf-8", errors="ignore")


def _build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(_stdlib_text(), trainer=trainer)
    tokenizer.save(str(out / "tokenizer.json"))
    (out / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "bos_token": "<s>",
                "eos_token": "<|im_end|>",
                "unk_token": "<unk>",
                "pad_token": "</s>",
                "model_max_length": MAX_POSITIONS,
                "chat_template": CHAT_TEMPLATE,
                "add_bos_token": False,
            },
            indent=2,
        )
    )


def _build_weights(out: Path, vocab_size: int, seed: int) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=MAX_POSITIONS,
        bos_token_id=1,
        eos_token_id=4,
        pad_token_id=2,
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.generation_config.eos_token_id = 4
    model.save_pretrained(out, safe_serialization=True)


def build(out: Path, *, seed: int = 0) -> None:
    _build_tokenizer(out)
    vocab_size = len(json.loads((out / "tokenizer.json").read_text())["model"]["vocab"])
    _build_weights(out, max(vocab_size, len(SPECIAL_TOKENS)), seed)


def ensure(progress: Callable[[str], None] = print, *, seed: int = 0) -> Path:
    """The tiny model's folder, built on first use (about 10 s). Another ``seed`` is
    another build of it: same tokenizer and shape, other weights (a second version)."""
    name = NAME if seed == 0 else f"{NAME}-seed{seed}"
    return prepared(
        name, lambda out: build(out, seed=seed),
        what=f"building (tokenizer from stdlib, random weights, seed {seed})", progress=progress,
    )  # fmt: skip
