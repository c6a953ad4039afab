"""Chat messages reach the template as vLLM passes them: content parts, developer role."""

from __future__ import annotations

import jinja2.sandbox
import pytest

from contracts.tokenization import PromptError, content_format, load_tokenizer
from modelstore import tiny_llama

ENV = jinja2.sandbox.ImmutableSandboxedEnvironment()


@pytest.mark.parametrize(
    ("template", "expected"),
    [
        ("{% for m in messages %}{{ m['content'] }}{% endfor %}", "string"),
        ("{% for m in messages %}{% for p in m['content'] %}{{ p.text }}{% endfor %}"
         "{% endfor %}", "openai"),
        ("{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}"
         "{% endfor %}", "openai"),
        ("{% for m in messages %}{% for p in m.content | list %}{% endfor %}{% endfor %}",
         "openai"),
    ],
)  # fmt: skip
def test_content_format_follows_whether_the_template_walks_content(template, expected):
    assert content_format(ENV.parse(template)) == expected


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(tiny_llama.ensure()))


def test_text_parts_render_as_the_same_text_joined_by_newlines(tokenizer):
    parts = [{"type": "text", "text": "What is"}, {"type": "text", "text": "a KV cache?"}]
    as_parts = tokenizer.render_chat([{"role": "user", "content": parts}])
    assert as_parts == tokenizer.render_chat([{"role": "user", "content": "What is\na KV cache?"}])


def test_developer_messages_become_one_leading_system_message(tokenizer):
    rendered = tokenizer.render_chat([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi."},
        {"role": "developer", "content": "Answer in French."},
    ])  # fmt: skip
    expected = tokenizer.render_chat([
        {"role": "system", "content": "Be brief.\n\nAnswer in French."},
        {"role": "user", "content": "Hi."},
    ])  # fmt: skip
    assert rendered == expected


@pytest.mark.parametrize(
    "part",
    [{"type": "image_url", "image_url": {"url": "data:,"}, "text": "x"}, {"type": "text"}, "hi"],
)
def test_parts_a_text_model_cannot_take_are_the_clients_error(tokenizer, part):
    with pytest.raises(PromptError):
        tokenizer.render_chat([{"role": "user", "content": [part]}])
