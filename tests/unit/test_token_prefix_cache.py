"""The token prefix cache gives exactly the tokenizer's ids, and tokenizes less."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers

from contracts.tokenization import ModelTokenizer, load_tokenizer
from modelstore import tiny_llama
from router.prepare.token_prefix_cache import TokenPrefixCache


@pytest.fixture(scope="module")
def tiny() -> ModelTokenizer:
    return load_tokenizer(str(tiny_llama.ensure()))


PIECES = ["the", "cat", "sat", ",", ".", " ", "  ", "\n", "\t", "12345", "3.14", "naïve",
          "東京", "'s", "--", "(", ")", "é", "😀", "<|im_start|>", "on", "mat"]  # fmt: skip
texts = st.lists(st.sampled_from(PIECES), min_size=1, max_size=120).map("".join)


@settings(max_examples=150, deadline=None, derandomize=True)
@given(shared=texts, tails=st.lists(texts, min_size=1, max_size=4), specials=st.booleans())
def test_ids_equal_the_tokenizers_for_prompts_that_share_prefixes(tiny, shared, tails, specials):
    cache = TokenPrefixCache(max_tokens=10_000, stride_chars=8)  # many cuts in short texts
    for tail in tails:
        text = shared + tail
        ids, _ = cache.encode(tiny, text, add_special_tokens=specials)
        assert ids == tiny.encode(text, add_special_tokens=specials)


def test_a_prompt_that_extends_one_seen_tokenizes_only_past_the_shared_part(tiny):
    cache = TokenPrefixCache(max_tokens=100_000, stride_chars=256)
    system = "You are a careful assistant. Answer in full sentences, citing sources. " * 40
    first = system + "Question one: what is the boiling point of water?"
    second = system + "Question two: who wrote the Iliad, and when?"
    ids, reused = cache.encode(tiny, first, add_special_tokens=True)
    assert reused == 0 and ids == tiny.encode(first, add_special_tokens=True)
    ids, reused = cache.encode(tiny, second, add_special_tokens=True)
    assert ids == tiny.encode(second, add_special_tokens=True)
    assert len(system) - 256 <= reused <= len(system)
    # The next turn of a conversation extends the whole of the previous prompt.
    turn = second + " The Iliad is attributed to Homer. Question three: why?"
    ids, reused = cache.encode(tiny, turn, add_special_tokens=True)
    assert ids == tiny.encode(turn, add_special_tokens=True)
    assert reused >= len(second) - 256


def test_the_cache_holds_at_most_its_token_bound_and_stays_exact_after_evictions(tiny):
    cache = TokenPrefixCache(max_tokens=300, stride_chars=64)
    prompts = [f"document {i}: " + "lorem ipsum dolor sit amet " * 30 for i in range(20)]
    for text in prompts + prompts[:5]:
        ids, _ = cache.encode(tiny, text, add_special_tokens=False)
        assert ids == tiny.encode(text, add_special_tokens=False)
        assert cache._held_tokens <= 300


def trained(pre_tokenizer, post_processor=None) -> ModelTokenizer:
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    if pre_tokenizer is not None:
        tokenizer.pre_tokenizer = pre_tokenizer
    trainer = trainers.BpeTrainer(vocab_size=150, special_tokens=["<unk>", "</s>"])
    tokenizer.train_from_iterator(["the cat sat on the mat, twice. " * 50], trainer)
    if post_processor is not None:
        tokenizer.post_processor = post_processor
    return ModelTokenizer(
        tokenizer=tokenizer, chat_template=None, template_variables={},
        special_ids=frozenset(), vocab_size=150, max_chars_per_token=8,
    )  # fmt: skip


def test_a_sentencepiece_style_tokenizer_splits_at_spaces_too(tiny):
    """Metaspace puts its "▁" before each word, and prepends one only to text that does
    not start with a space: a tail cut before a space encodes as it does in place."""
    model = trained(pre_tokenizers.Metaspace(prepend_scheme="always"))
    cache = TokenPrefixCache(max_tokens=10_000, stride_chars=16)
    text = "the cat sat on the mat " * 10
    ids, _ = cache.encode(model, text + "twice", add_special_tokens=False)
    ids, reused = cache.encode(model, text + "mat", add_special_tokens=False)
    assert reused > 0 and ids == model.encode(text + "mat", add_special_tokens=False)


@pytest.mark.parametrize(
    ("pre_tokenizer", "post_processor", "specials"),
    [
        (None, None, False),  # no pre-tokenizer: merges cross spaces
        (pre_tokenizers.Metaspace(), processors.TemplateProcessing(
            single="$A </s>", special_tokens=[("</s>", 1)]), True),  # appends a token
    ],
    ids=["merges across spaces", "appends a special"],
)  # fmt: skip
def test_a_tokenizer_whose_ids_change_at_a_cut_is_never_cached(
    pre_tokenizer, post_processor, specials
):
    model = trained(pre_tokenizer, post_processor)
    cache = TokenPrefixCache(max_tokens=10_000, stride_chars=16)
    text = "the cat sat on the mat, " * 10
    for tail in ("twice.", "the mat"):
        ids, reused = cache.encode(model, text + tail, add_special_tokens=specials)
        assert reused == 0 and ids == model.encode(text + tail, add_special_tokens=specials)
