"""The router's tokenizer counts tokens as transformers (and so vLLM) does, per model.

all-MiniLM-L6-v2's tokenizer.json saves padding and truncation to 128 tokens; read as
is, every input would count 128 tokens, and a tenant's tpm would be charged that.
"""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from contracts.tokenization import load_tokenizer
from modelstore import minilm, tiny_llama

TEXTS = ["hello world", "", "A KV cache holds keys and values. " * 60]


@pytest.mark.parametrize("module", [minilm, tiny_llama], ids=["minilm", "tiny"])
def test_token_ids_equal_transformers(module):
    folder = str(module.ensure())
    ours, theirs = load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)
    for text in TEXTS:
        assert ours.encode(text, add_special_tokens=True) == theirs(text)["input_ids"]
    assert len(ours.encode(TEXTS[2], add_special_tokens=True)) > 128
