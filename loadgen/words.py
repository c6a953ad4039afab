"""Prompt text with an exact token count: runs of words that are one token each.

A word the tokenizer encodes as exactly one token, written with its leading space,
never merges with its neighbours (byte-level BPE splits before each space; WordPiece,
as BERT's embedding models use, splits on whitespace and keeps a whole word found in
its vocabulary as one token), so a run of N such words is N tokens, and two runs
share exactly the tokens they share as words. Benchmarks build every synthetic
prompt from these runs.
"""

from __future__ import annotations

import hashlib
import random

from contracts.tokenization import ModelTokenizer


def one_token_words(tokenizer: ModelTokenizer) -> list[str]:
    """Words (with their leading space) that the tokenizer encodes as exactly one token."""
    words = []
    # WordPiece's tokens decode without the space that separates words.
    spaced = type(tokenizer.tokenizer.model).__name__ == "WordPiece"
    for token_id in sorted(tokenizer.tokenizer.get_vocab().values()):
        text = tokenizer.decode_one(token_id)
        if spaced and not text.startswith(" "):
            text = " " + text
        plain_word = text.startswith(" ") and text[1:].isalpha() and text.isascii()
        if (
            plain_word
            and len(text) > 2
            and tokenizer.encode(text, add_special_tokens=False) == [token_id]
        ):
            words.append(text)
    return words


class WordSource:
    """Deterministic runs of one-token words, named by a key."""

    def __init__(self, tokenizer: ModelTokenizer) -> None:
        self._words = one_token_words(tokenizer)
        if len(self._words) < 100:
            raise ValueError("the tokenizer has too few single-token words to build prompts")

    def words(self, key: str, count: int) -> list[str]:
        rng = random.Random(hashlib.sha256(key.encode()).digest())
        return rng.choices(self._words, k=count)

    def run(self, key: str, count: int) -> str:
        return "".join(self.words(key, count))
