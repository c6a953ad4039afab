"""Clients that keep sending completions (streamed and whole, alternately) until stopped.

Every outcome is kept: "ok", or what went wrong. With several router URLs, a request the
first cannot answer (a transport error, or a stream cut by the router's death) is
retried on the next, as a client of replicated routers would.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import httpx

from tests.clusters import MODEL
from tests.generation import Generation, generate


@dataclass
class ClientLoad:
    urls: tuple[str, ...]
    max_tokens: int = 8
    prompt_repeats: int = 10  # "client I turn T " this many times: about 5 tokens each
    stop: threading.Event = field(default_factory=threading.Event)
    outcomes: list[str] = field(default_factory=list)
    retried: int = 0
    _threads: list[threading.Thread] = field(default_factory=list)

    def start(self, clients: int) -> None:
        self._threads = [threading.Thread(target=self._run, args=(i,)) for i in range(clients)]
        for thread in self._threads:
            thread.start()

    def finish(self) -> list[str]:
        """Stop, wait for the clients, and return the failures."""
        self.stop.set()
        for thread in self._threads:
            thread.join(timeout=90)
        return [o for o in self.outcomes if o != "ok"]

    def _run(self, index: int) -> None:
        turn = 0
        while not self.stop.is_set():
            turn += 1
            body = {"model": MODEL, "prompt": f"client {index} turn {turn} " * self.prompt_repeats,
                    "max_tokens": self.max_tokens, "stream": turn % 2 == 0}  # fmt: skip
            self.outcomes.append(self._one(body))

    def _one(self, body: dict) -> str:
        why = "no router answered"
        for attempt, url in enumerate(self.urls):
            try:
                result = generate(url, "/v1/completions", body, timeout_s=60)
            except httpx.TransportError as error:
                why = f"{url}: {error!r}"
                continue
            if _complete(result, body):
                self.retried += attempt
                return "ok"
            why = f"{url}: {result.status} {result.body or result.error_events}"
            if not result.error_events:
                return why  # an answer, not a death: retrying would hide it
        return why


def _complete(result: Generation, body: dict) -> bool:
    whole = result.done or not body["stream"]
    return result.status == 200 and whole and not result.error_events
