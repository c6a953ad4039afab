"""A model's own tokenizer and chat template, tokenizing exactly as vLLM's API server does.

The router hashes prompt blocks to find cached prefixes, and the simulator stands
in for vLLM; both must see the token ids vLLM would see, or block hashes never
match. vLLM's rules (``entrypoints/openai``):
- completions: ``add_special_tokens=True`` (the tokenizer's post-processor, e.g. BOS);
- chat: the template is rendered with ``add_generation_prompt=True`` and the
  tokenizer's special tokens as variables, then encoded with ``add_special_tokens=False``
  (the template writes its own specials);
- a prompt given as token ids is used as is;
- message content given as parts (``[{"type": "text", "text": ...}]``) reaches the
  template as vLLM passes it: joined with newlines into one string, unless the
  template itself loops over ``message.content`` (vLLM's "openai" content format);
- a ``developer`` message becomes ``system`` when the template never names that role.

``tokenizers`` and ``jinja2`` only (no ``transformers``): light enough for one
shared, cached instance per model folder in a router or among hundreds of sims.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jinja2.nodes
import jinja2.sandbox
from tokenizers import Tokenizer


class PromptError(ValueError):
    """The request's prompt or messages cannot be tokenized; the client's fault."""


_PROMPT_SHAPE = "prompt must be a string, or a non-empty list of token ids"


def _is_token_ids(prompt: Any) -> bool:
    return isinstance(prompt, list) and bool(prompt) and all(type(t) is int for t in prompt)


@dataclass(frozen=True, slots=True)
class ModelTokenizer:
    tokenizer: Tokenizer
    chat_template: jinja2.Template | None
    template_variables: dict[str, str]  # bos_token, eos_token, ... as HF passes them
    special_ids: frozenset[int]
    vocab_size: int
    # The longest token's text: a prompt of more characters than this x N tokens has
    # more than N tokens, known without tokenizing it (vLLM's pre-check, too).
    max_chars_per_token: int
    # How the template wants message content given as parts (see the module docstring).
    content_format: Literal["string", "openai"] = "string"
    knows_developer_role: bool = False

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode_one(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        tools: list[Any] | None = None,
        template_kwargs: dict[str, Any] | None = None,
    ) -> str:
        """The chat template applied as vLLM applies it, with the request's template
        switches (``add_generation_prompt``, ``tools``, ``chat_template_kwargs``)."""
        if self.chat_template is None:
            raise PromptError("this model has no chat template; use /v1/completions")
        if not isinstance(messages, list) or not messages:
            raise PromptError("messages must be a non-empty list")
        conversation = [self._as_vllm_passes_it(m) for m in messages]
        if not self.knows_developer_role and any(
            m.get("role") == "developer" for m in conversation
        ):
            conversation = _developer_as_system(conversation)
        variables = {**(template_kwargs or {}), **self.template_variables}
        if tools is not None:
            variables["tools"] = tools
        return self.chat_template.render(
            **variables, messages=conversation, add_generation_prompt=add_generation_prompt
        )

    def _as_vllm_passes_it(self, message: Any) -> dict[str, Any]:
        if not isinstance(message, dict):
            raise PromptError("each message must be an object")
        message = dict(message)
        parts = message.get("content")
        if isinstance(parts, list):
            texts = [_part_text(part) for part in parts]
            message["content"] = (
                "\n".join(texts)
                if self.content_format == "string"
                else [{"type": "text", "text": text} for text in texts]
            )
        return message

    def chat_ids(self, messages: list[dict[str, Any]], **switches: Any) -> list[int]:
        return self.encode(self.render_chat(messages, **switches), add_special_tokens=False)

    def completion_ids(self, prompt: Any) -> list[int]:
        """A completions ``prompt``: a string, a one-string list, or token ids."""
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return self.encode(prompt, add_special_tokens=True)
        if _is_token_ids(prompt):
            return list(prompt)
        raise PromptError(_PROMPT_SHAPE)

    def request_ids(self, body: dict[str, Any], *, chat: bool) -> list[int]:
        """The prompt token ids of an OpenAI request body, as vLLM computes them."""
        text = self.request_text(body, chat=chat)
        if text is None:
            return self.completion_ids(body.get("prompt"))
        return self.encode(text[0], add_special_tokens=text[1])

    def request_text(self, body: dict[str, Any], *, chat: bool) -> tuple[str, bool] | None:
        """The text vLLM encodes for this body, and whether with the tokenizer's specials;
        None when the prompt is token ids already."""
        if chat:
            kwargs = body.get("chat_template_kwargs")
            text = self.render_chat(
                body.get("messages"),  # type: ignore[arg-type]
                add_generation_prompt=body.get("add_generation_prompt", True) is not False,
                tools=body.get("tools") if isinstance(body.get("tools"), list) else None,
                template_kwargs=kwargs if isinstance(kwargs, dict) else None,
            )
            return text, False
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return prompt, True
        if _is_token_ids(prompt):
            return None
        raise PromptError(_PROMPT_SHAPE)


def _developer_as_system(conversation: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """vLLM's rewrite for templates without a developer role: developer messages become
    system ones, and several system messages merge into one at the front."""
    converted = [
        {**{k: v for k, v in m.items() if k != "tools"}, "role": "system"}
        if m.get("role") == "developer" else m
        for m in conversation
    ]  # fmt: skip
    system = [i for i, m in enumerate(converted) if m.get("role") == "system"]
    if system == [0] or not system:
        return converted
    texts = [converted[i].get("content") for i in system]
    merged = {
        "role": "system",
        "content": "\n\n".join(t for t in texts if isinstance(t, str) and t),
    }
    return [merged, *(m for m in converted if m.get("role") != "system")]


def _part_text(part: Any) -> str:
    if not isinstance(part, dict) or not isinstance(part.get("text"), str):
        raise PromptError("a content part must be an object with a string 'text'")
    if part.get("type") not in ("text", "input_text"):
        raise PromptError(f"content parts of type {part.get('type')!r} need a multimodal model")
    return part["text"]


def content_format(template: jinja2.nodes.Template) -> Literal["string", "openai"]:
    """vLLM's detection, simplified: "openai" when some loop iterates ``x.content`` or
    ``x['content']``, i.e. the template walks content parts itself."""
    for loop in template.find_all(jinja2.nodes.For):
        target = loop.iter
        while isinstance(target, jinja2.nodes.Filter | jinja2.nodes.Test) and target.node:
            target = target.node
        if isinstance(target, jinja2.nodes.Getattr) and target.attr == "content":
            return "openai"
        if (
            isinstance(target, jinja2.nodes.Getitem)
            and isinstance(target.arg, jinja2.nodes.Const)
            and target.arg.value == "content"
        ):
            return "openai"
    return "string"


@cache
def load_tokenizer(model_dir: str) -> ModelTokenizer:
    """The tokenizer of a model folder (``tokenizer.json`` plus its config and template)."""
    folder = Path(model_dir)
    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    # Some folders (sentence-transformers' BERTs) save padding and truncation to 128 in
    # tokenizer.json; transformers, and so vLLM, encode a text without either.
    tokenizer.no_padding()
    tokenizer.no_truncation()
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text()) if config_path.exists() else {}
    template = config.get("chat_template")
    template_file = folder / "chat_template.jinja"  # where newer transformers save it
    if not isinstance(template, str) and template_file.exists():
        template = template_file.read_text()
    environment = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    variables = {
        key: value
        for key in ("bos_token", "eos_token", "unk_token", "pad_token")
        if isinstance(value := config.get(key), str)
    }
    vocab = tokenizer.get_vocab(with_added_tokens=True)
    special = {i for token, i in vocab.items() if token.startswith("<") and token.endswith(">")}
    has_template = isinstance(template, str)
    return ModelTokenizer(
        tokenizer=tokenizer,
        chat_template=environment.from_string(template) if has_template else None,
        template_variables=variables,
        special_ids=frozenset(special),
        vocab_size=tokenizer.get_vocab_size(with_added_tokens=False),
        max_chars_per_token=max(map(len, vocab), default=1),
        content_format=content_format(environment.parse(template)) if has_template else "string",
        knows_developer_role=has_template
        and ("'developer'" in template or '"developer"' in template),
    )
