"""A run's numbers, with ``vllm bench serve``'s definitions.

- TTFT: send to first token; TPOT: (E2E - TTFT) / (output tokens - 1), per request
  with 2+ tokens; ITL: every gap between consecutive tokens, pooled over requests;
  E2E: send to last byte. Each as mean, p50, p90 and p99 in milliseconds, over the
  requests that succeeded.
- request throughput: succeeded requests / duration; output token throughput:
  their output tokens / duration; total token throughput adds their prompt tokens.
- goodput: succeeded requests / duration that met every SLO given (TTFT, TPOT, E2E).
- errors: failed requests by HTTP status or error kind (429s are rejections).
Duration runs from the first send to the last answer.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from loadgen.client import RequestResult


@dataclass(frozen=True, slots=True)
class SLO:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def met_by(self, result: RequestResult) -> bool:
        checks = (
            (self.ttft_ms, result.ttft_s),
            (self.tpot_ms, result.tpot_s),
            (self.e2e_ms, result.e2e_s),
        )
        return all(
            limit is None or (value is not None and value * 1000 <= limit)
            for limit, value in checks
        )


def percentiles(values_s: list[float]) -> dict[str, float | None]:
    if not values_s:
        return {"mean": None, "p50": None, "p90": None, "p99": None}
    ordered = sorted(v * 1000 for v in values_s)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return {"mean": statistics.fmean(ordered), "p50": at(0.5), "p90": at(0.9), "p99": at(0.99)}


def error_kind(result: RequestResult) -> str:
    if result.status and result.status != 200:
        return str(result.status)
    return (result.error or "unknown").split(":")[0]


def summarize(results: list[RequestResult], slo: SLO = SLO()) -> dict:
    ok = [r for r in results if r.ok]
    sent = [r for r in results if r.status or r.error not in ("not_sent", "deadline")]
    if ok:
        start = min(r.started_s for r in sent)
        duration_s = max(r.started_s + r.e2e_s for r in ok) - start
    else:
        duration_s = 0.0
    duration_s = max(duration_s, 1e-9)
    output_tokens = sum(r.output_tokens for r in ok)
    prompt_tokens = sum(r.prompt_tokens or 0 for r in ok)
    errors: dict[str, int] = {}
    for result in results:
        if not result.ok:
            kind = error_kind(result)
            errors[kind] = errors.get(kind, 0) + 1
    return {
        "requests": len(results),
        "succeeded": len(ok),
        "failed": len(results) - len(ok),
        "errors": errors,
        "duration_s": duration_s,
        "request_throughput": len(ok) / duration_s,
        "output_token_throughput": output_tokens / duration_s,
        "total_token_throughput": (output_tokens + prompt_tokens) / duration_s,
        "goodput": sum(1 for r in ok if slo.met_by(r)) / duration_s,
        "slo_attainment": sum(1 for r in ok if slo.met_by(r)) / max(1, len(results)),
        "ttft_ms": percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_ms": percentiles([t for r in ok if (t := r.tpot_s) is not None]),
        "itl_ms": percentiles([gap for r in ok for gap in r.itl_s]),
        "e2e_ms": percentiles([r.e2e_s for r in ok]),
    }
