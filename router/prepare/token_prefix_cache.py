"""Token ids of prompt text seen lately, so that a prompt starting with it (a long system
prompt, a document asked about again, the next turn of a conversation) is tokenized
only past it: llm-d's prefix store, for the router's own tokenizing.

Invariants:
- ``encode`` returns exactly the ids the tokenizer gives the whole text. Ids are reused
  only up to a *cut*: a space that follows a non-space. The GPT-2 and Llama-3
  pre-tokenizer patterns always split there, whatever follows, and BPE merges never
  cross a split, so the ids before a cut do not depend on the text after it. That is
  checked, not assumed: a cut is stored only where the whole text's encoding has a token
  boundary, and a tokenizer that fails the self-test on its first use (a sentencepiece
  "▁" prepended to every encode, a post-processor that appends a token) is never cached.
- Cuts fall near every ``stride_chars`` characters, chosen from the text before that
  point only, so two prompts that share a prefix share its cuts.
- An entry is keyed by a 128-bit BLAKE2b of the text up to and including its cut's
  space, chained from the previous cut's key (with the tokenizer and whether specials
  are added at the root). It holds the ids between its parent's cut and its own, so
  memory grows with the text, not its square.
- Bounded: at most ``max_tokens`` ids held, least recently used entries evicted first.
  A lookup follows parent links from the root, so an entry whose parent was evicted is
  never used.
- Thread-safe: long prompts are tokenized in threads. The lock covers the table only,
  never the tokenizing.
"""

from __future__ import annotations

import threading
from array import array
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from hashlib import blake2b

from tokenizers import Encoding

from contracts.tokenization import ModelTokenizer

# Split points the self-test probes: a space after letters, digits, punctuation, a
# newline, a double space and non-ASCII text.
_SELF_TEST = (
    'The quick brown fox, 12345 jumps; over  the lazy dog.\n It said: "hello" '
    "(twice) -- then 3.14 naïve café 東京 ok\t tab end"
)


@dataclass(frozen=True, slots=True)
class _Entry:
    parent: bytes
    ids: array  # the ids from the parent's cut to this one's


class TokenPrefixCache:
    def __init__(self, *, max_tokens: int, stride_chars: int) -> None:
        self._max_tokens = max_tokens
        self._stride_chars = stride_chars
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._held_tokens = 0
        self._lock = threading.Lock()
        # (tokenizer id, specials) -> the tokenizer, held so that its id is never reused,
        # and whether it passed the self-test. One entry per model's tokenizer.
        self._safe: dict[tuple[int, bool], tuple[ModelTokenizer, bool]] = {}

    def __repr__(self) -> str:
        return f"TokenPrefixCache(entries={len(self._entries)}, tokens={self._held_tokens})"

    def encode(
        self, tokenizer: ModelTokenizer, text: str, *, add_special_tokens: bool
    ) -> tuple[list[int], int]:
        """``tokenizer.encode(text, add_special_tokens=...)``, reusing a cached prefix, and
        how many of the text's characters were not tokenized again."""
        if (
            self._max_tokens <= 0
            or len(text) <= self._stride_chars
            or not self._passes_self_test(tokenizer, add_special_tokens)
        ):
            return tokenizer.encode(text, add_special_tokens=add_special_tokens), 0
        root = blake2b(f"{id(tokenizer)}:{add_special_tokens}".encode(), digest_size=16).digest()
        cuts = list(_keyed_cuts(text, self._stride_chars, root))
        ids: list[int] = []
        parent, reused = root, 0
        with self._lock:
            for cut, key in cuts:
                entry = self._entries.get(key)
                if entry is None or entry.parent != parent:
                    break
                self._entries.move_to_end(key)
                ids.extend(entry.ids)
                parent, reused = key, cut
        specials = add_special_tokens and not reused
        encoding = tokenizer.tokenizer.encode(text[reused:], add_special_tokens=specials)
        base = len(ids)
        ids.extend(encoding.ids)
        self._store(cuts, reused, parent, ids, base, encoding)
        return ids, reused

    def _store(
        self,
        cuts: list[tuple[int, bytes]],
        reused: int,
        parent: bytes,
        ids: list[int],
        base: int,
        encoding: Encoding,
    ) -> None:
        """Entries for the cuts past ``reused``, while the new encoding (of the text from
        ``reused`` on; its ids from ``base`` on in ``ids``) has a token boundary at each."""
        added: list[tuple[bytes, _Entry]] = []
        previous = base
        for cut, key in cuts:
            if cut <= reused:
                continue
            index = _token_starting_at(encoding, cut - reused)
            if index is None:
                break  # a token spans the cut: no boundary here, and the chain ends
            index += base
            added.append((key, _Entry(parent, array("I", ids[previous:index]))))
            parent, previous = key, index
        if not added:
            return
        with self._lock:
            for key, entry in added:
                if key in self._entries:
                    continue
                self._entries[key] = entry
                self._held_tokens += len(entry.ids)
            while self._held_tokens > self._max_tokens and self._entries:
                _, evicted = self._entries.popitem(last=False)
                self._held_tokens -= len(evicted.ids)

    def _passes_self_test(self, tokenizer: ModelTokenizer, add_special_tokens: bool) -> bool:
        """Whether splitting at each cut of a sample text gives the whole text's ids."""
        key = (id(tokenizer), add_special_tokens)
        known = self._safe.get(key)
        if known is None:
            known = self._safe[key] = (tokenizer, _splits_cleanly(tokenizer, add_special_tokens))
        return known[1]


def _splits_cleanly(tokenizer: ModelTokenizer, add_special_tokens: bool) -> bool:
    """The pre-tokenizer splits the sample at every cut (BPE merges never cross a split,
    whatever the vocabulary: a sample alone could miss a merge the vocabulary has), and
    the ids of a head and its tail, encoded apart, are the whole's."""
    pre_tokenizer = tokenizer.tokenizer.pre_tokenizer
    if pre_tokenizer is None:
        return False
    splits = {start for _, (start, _) in pre_tokenizer.pre_tokenize_str(_SELF_TEST)}
    whole = tokenizer.tokenizer.encode(_SELF_TEST, add_special_tokens=add_special_tokens)
    for cut in _cut_points(_SELF_TEST, 1):
        if cut not in splits:
            return False
        head = tokenizer.tokenizer.encode(_SELF_TEST[:cut], add_special_tokens=add_special_tokens)
        tail = tokenizer.encode(_SELF_TEST[cut:], add_special_tokens=False)
        if head.ids + tail != whole.ids:
            return False
    return True


def _token_starting_at(encoding: Encoding, at: int) -> int | None:
    """The index of the token that starts at character ``at`` (the cut's space), every
    earlier token ending by it; None if no token boundary is there. One token's offsets
    at a time: materializing them all costs more than the rest of the bookkeeping."""
    index = encoding.char_to_token(at)
    if not index:  # None, or the first token: it spans the text before the cut too
        return None
    span = encoding.token_to_chars(index)
    before = encoding.token_to_chars(index - 1)
    if span is None or span[0] != at or (before is not None and before[1] > at):
        return None
    return index


def _cut_points(text: str, stride_chars: int) -> Iterator[int]:
    """The last space after a non-space at or before each multiple of ``stride_chars``
    (and after the previous cut), found from the text before that point only."""
    previous = 0
    for target in range(stride_chars, len(text), stride_chars):
        at = text.rfind(" ", previous + 1, target + 1)
        while at > previous and text[at - 1].isspace():
            at = text.rfind(" ", previous + 1, at)
        if at > previous:
            yield at
            previous = at


def _keyed_cuts(text: str, stride_chars: int, root: bytes) -> Iterator[tuple[int, bytes]]:
    key, start = root, 0
    for cut in _cut_points(text, stride_chars):
        key = blake2b(key + text[start : cut + 1].encode(), digest_size=16).digest()
        start = cut + 1
        yield cut, key
