"""The model's own tokenizer and chat template, without transformers.

The simulator tokenizes like the engine it stands in for, so prompt lengths,
block hashes and usage match. ``tokenizers`` and ``jinja2`` are light enough to
share one instance among hundreds of sims in a process.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2.sandbox
from tokenizers import Tokenizer


@dataclass(frozen=True, slots=True)
class SimTokenizer:
    tokenizer: Tokenizer
    chat_template: jinja2.Template | None
    special_ids: frozenset[int]
    vocab_size: int

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def render_chat(self, messages: list[dict]) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; use /v1/completions")
        return self.chat_template.render(messages=messages, add_generation_prompt=True)

    def output_ids(self, seed: int, prompt_ids: list[int], count: int) -> list[int]:
        """The deterministic 'generation' for a prompt: ordinary tokens from the vocabulary."""
        rng = random.Random(hash((seed, tuple(prompt_ids))) & 0xFFFFFFFF)
        ids = []
        while len(ids) < count:
            token = rng.randrange(self.vocab_size)
            if token not in self.special_ids:
                ids.append(token)
        return ids


@cache
def load_tokenizer(model_dir: str) -> SimTokenizer:
    folder = Path(model_dir)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    template = config.get("chat_template")
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    special = {
        token_id
        for token, token_id in tokenizer.get_vocab(with_added_tokens=True).items()
        if token.startswith("<") and token.endswith(">")
    }
    return SimTokenizer(
        tokenizer=tokenizer,
        chat_template=environment.from_string(template) if isinstance(template, str) else None,
        special_ids=frozenset(special),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=False),
    )
