"""One streamed OpenAI request, timed the way ``vllm bench serve`` times it.

- TTFT: from sending the request to the first content chunk;
- ITL: the gaps between consecutive content chunks;
- TPOT: (end-to-end - TTFT) / (output tokens - 1), for requests with 2+ tokens;
- output tokens: the server's ``usage.completion_tokens`` (``include_usage`` is
  always asked for), else the number of content chunks;
- a 200 stream that ends without ``data: [DONE]`` failed (kind ``truncated``): its
  text may be cut short, and an OpenAI client would see it as an error.

An embedding request (``embed_request``) is not streamed: it is timed end to end, its
prompt tokens are the answer's ``usage``, and a 200 whose ``data`` does not hold one
vector per input, in order, failed (kind ``bad_answer``).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import aiohttp


@dataclass(slots=True)
class RequestResult:
    started_s: float  # perf_counter at send
    status: int = 0
    ttft_s: float | None = None
    e2e_s: float = 0.0
    output_tokens: int = 0
    prompt_tokens: int | None = None
    itl_s: list[float] = field(default_factory=list)
    error: str | None = None
    # The router's admission forecast (its x-pdserve-predicted-ttft-ms header), if any.
    predicted_ttft_s: float | None = None
    text: str = ""  # the answer's text, when asked to keep it

    @property
    def ok(self) -> bool:
        return self.error is None and self.status == 200

    @property
    def tpot_s(self) -> float | None:
        if not self.ok or self.ttft_s is None or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


async def stream_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    headers: dict[str, str] | None = None,
    *,
    keep_text: bool = False,
) -> RequestResult:
    """POST a streamed completion or chat request and time it; never raises for HTTP errors.
    ``keep_text``: also keep the answer's text (a fault test compares it)."""
    body = {**body, "stream": True, "stream_options": {"include_usage": True}}
    result = RequestResult(started_s=time.perf_counter())
    last_s = result.started_s
    chunks = 0
    done = False
    try:
        async with session.post(url, json=body, headers=headers) as response:
            result.status = response.status
            predicted_ms = response.headers.get("x-pdserve-predicted-ttft-ms")
            if predicted_ms is not None and predicted_ms.isdigit():
                result.predicted_ttft_s = int(predicted_ms) / 1000
            if response.status != 200:
                result.error = f"HTTP {response.status}: {(await response.text())[:600]}"
                result.e2e_s = time.perf_counter() - result.started_s  # how fast the refusal
                return result
            event = None
            async for raw_line in response.content:
                line = raw_line.strip()
                if line.startswith(b"event:"):
                    event = line[6:].strip().decode()
                    continue
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    done = True
                    break
                payload = json.loads(data)
                if event == "error" or "error" in payload:
                    result.error = f"stream error: {json.dumps(payload)[:200]}"
                    break
                now = time.perf_counter()
                if _has_content(payload):
                    chunks += 1
                    if keep_text:
                        result.text += "".join(map(_text_of, payload["choices"]))
                    if result.ttft_s is None:
                        result.ttft_s = now - result.started_s
                    else:
                        result.itl_s.append(now - last_s)
                    last_s = now
                usage = payload.get("usage")
                if usage:
                    result.output_tokens = usage.get("completion_tokens", 0)
                    result.prompt_tokens = usage.get("prompt_tokens")
        if not done and result.error is None:
            result.error = "truncated: the stream ended without data: [DONE]"
    except (aiohttp.ClientError, TimeoutError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.e2e_s = time.perf_counter() - result.started_s
    result.output_tokens = result.output_tokens or chunks
    return result


async def embed_request(
    session: aiohttp.ClientSession,
    url: str,
    body: dict,
    headers: dict[str, str] | None = None,
) -> RequestResult:
    """POST an embeddings request and time it; never raises for HTTP errors."""
    result = RequestResult(started_s=time.perf_counter())
    inputs = body.get("input")
    several = isinstance(inputs, list) and inputs and not isinstance(inputs[0], int)
    expected = len(inputs) if several else 1
    try:
        async with session.post(url, json=body, headers=headers) as response:
            result.status = response.status
            raw = await response.read()
        if result.status != 200:
            result.error = f"HTTP {result.status}: {raw[:600].decode(errors='replace')}"
        else:
            answer = json.loads(raw)
            data = answer.get("data") or []
            if [item.get("index") for item in data] != list(range(expected)) or not all(
                item.get("embedding") for item in data
            ):
                result.error = f"bad_answer: {len(data)} vectors for {expected} inputs"
            result.prompt_tokens = (answer.get("usage") or {}).get("prompt_tokens")
    except (aiohttp.ClientError, TimeoutError, ValueError) as error:
        result.error = f"{type(error).__name__}: {error}"
    result.e2e_s = time.perf_counter() - result.started_s
    return result


def _text_of(choice: dict) -> str:
    return choice.get("text") or (choice.get("delta") or {}).get("content") or ""


def _has_content(chunk: dict) -> bool:
    """A token chunk (possibly empty text: a token can be part of a UTF-8 character)."""
    for choice in chunk.get("choices") or ():
        if "text" in choice or (choice.get("delta") or {}).get("content") is not None:
            return True
    return False
