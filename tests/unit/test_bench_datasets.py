"""``pdserve bench``'s prompts have the token lengths they promise, for BPE and WordPiece."""

from __future__ import annotations

import statistics

import pytest

from contracts.tokenization import load_tokenizer
from loadgen import datasets
from loadgen.words import WordSource
from modelstore import minilm, tiny_llama


@pytest.fixture(scope="module", params=[minilm, tiny_llama], ids=["wordpiece", "bpe"])
def tokenizer(request):
    return load_tokenizer(str(request.param.ensure()))


def test_a_run_of_n_words_is_n_tokens(tokenizer):
    words = WordSource(tokenizer)
    for count in (1, 37, 300):
        text = words.run(f"k{count}", count)
        assert len(tokenizer.encode(text, add_special_tokens=False)) == count


def test_embedding_inputs_have_their_lengths_and_the_cut_is_counted(tokenizer):
    requests, cut = datasets.embedding_inputs(
        WordSource(tokenizer), 50, input_len=64, range_ratio=1.0, len_dist="lognormal",
        inputs_per_request=4, max_input_len=200, seed=3,
    )  # fmt: skip
    lengths = []
    for request in requests:
        texts = request.payload["input"]
        assert len(texts) == 4
        counted = [len(tokenizer.encode(t, add_special_tokens=False)) for t in texts]
        assert sum(counted) == request.input_tokens
        lengths += counted
    assert max(lengths) <= 200
    assert cut == sum(1 for n in lengths if n == 200) > 0  # a long tail, cut and counted
    assert statistics.median(lengths) < 64 < statistics.fmean(lengths) * 1.3  # skewed
