"""What a live fleet did over one planning interval, read from the routers' ``/metrics``.

The planner runs beside the routers, not in them: it scrapes every replica (each one's
``/metrics`` already sums its processes) and adds them up, so one planner sees the whole
fleet however many routers and processes serve it. Between two scrapes it reads, for a
model:
- **arrivals**: ``pdserve_arrivals_total``, every outcome (a 429 arrived too), batch
  lines left out (their backlog is read instead), and the sizes of the clumps they came
  in (``pdserve_arrival_clump_size``);
- **lengths**: ``pdserve_request_prompt_tokens`` and ``pdserve_request_output_tokens``,
  turned into up to ``max_lengths`` (input, output) pairs at evenly spaced quantiles of
  each. The histograms do not keep which input went with which output: the pairs are
  matched by a fixed shuffle (independence), which is what the model can know;
- **SLO attainment**: the share of ``pdserve_time_to_first_token_seconds`` and of
  ``pdserve_time_per_output_token_seconds`` under each SLO (linear inside the bucket
  that holds it: set SLOs at bucket bounds for exact figures);
- **prefix hits**: the prefill pool's ``pdserve_pool_prefix_cache_hits`` over queries;
- **$/hour per worker of each pool** (``worker_usd_per_hour``): the router's cost model
  as it charged the pool, ``pdserve_cost_usd`` over ``pdserve_worker_seconds``;
- **measured speeds**: the routers' TTFT predictor's prefill and handoff curves
  (``pdserve_ttft_predictor_fit``), each coefficient's median over the workers;
- **pressure** at the interval's end: requests waiting (the routers' prefill queues and
  the prefill engines' own), the decode pool's KV usage and its preemptions over the
  interval, and the running batches' lines due (``pdserve_batch_due_lines_per_second``,
  their pending lines and tokens).

Views every replica reads from the shared registry (engine queues, KV usage) count
once, the highest replica's; everything a replica holds or counts alone adds up.

Pure: text in, ``IntervalSample`` out.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from router.fleet.planner_model import Load, Slo
from router.fleet.planner_window import IntervalSample, Pressure

Series = dict[tuple[str, tuple[tuple[str, str], ...]], float]


@dataclass(frozen=True, slots=True)
class Scrape:
    at_s: float
    series: Series  # summed over the replicas: counts, and what each replica holds alone
    replicas: tuple[Series, ...] = ()  # each replica's own: views every replica shares


def parse_metrics(texts: list[str], at_s: float) -> Scrape:
    """Several routers' ``/metrics`` text, summed series by series (and each kept)."""
    series: Series = defaultdict(float)
    replicas = []
    for text in texts:
        own: Series = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                key = (sample.name, tuple(sorted(sample.labels.items())))
                series[key] += sample.value
                own[key] = sample.value
        replicas.append(own)
    return Scrape(at_s=at_s, series=dict(series), replicas=tuple(replicas))


def _sum(scrape: Scrape, name: str, **match: str) -> float:
    wanted = set(match.items())
    return sum(v for (n, labels), v in scrape.series.items() if n == name and wanted <= set(labels))


def _shared(scrape: Scrape, name: str, **match: str) -> float | None:
    """A view every replica reads from the shared registry (so each reports it whole):
    the highest replica's, not their sum; None where no replica reports it."""
    wanted = set(match.items())
    values = [v for own in scrape.replicas for (n, labels), v in own.items()
              if n == name and wanted <= set(labels)]  # fmt: skip
    return max(values) if values else None


_PREFILL_FIT = ("prefill_intercept_seconds", "prefill_seconds_per_token",
                "prefill_seconds_per_token_per_ktoken")  # fmt: skip
_HANDOFF_FIT = ("handoff_intercept_seconds", "handoff_seconds_per_request",
                "handoff_seconds_per_token")  # fmt: skip


def measured_curve(scrape: Scrape, model: str, coefficients: tuple[str, ...]) -> tuple | None:
    """The TTFT predictor's curve for the model's workers (``pdserve_ttft_predictor_fit``):
    each coefficient's median over every worker and replica that measured the whole
    curve (a replica learns from its own requests); None where none has."""
    curves = []
    for own in scrape.replicas:
        by_worker: dict[str, dict[str, float]] = defaultdict(dict)
        for (name, labels), value in own.items():
            tags = dict(labels)
            if name == "pdserve_ttft_predictor_fit" and tags.get("model") == model:
                by_worker[tags["worker"]][tags["coefficient"]] = value
        curves += [tuple(c[k] for k in coefficients) for c in by_worker.values()
                   if all(k in c for k in coefficients)]  # fmt: skip
    if not curves:
        return None
    return tuple(statistics.median(values) for values in zip(*curves, strict=True))


def _delta(before: Scrape, after: Scrape, name: str, model: str, pool: str | None = None) -> float:
    match = {"model": model} if pool is None else {"model": model, "pool": pool}
    return _sum(after, name, **match) - _sum(before, name, **match)


def _buckets(scrape: Scrape, name: str, model: str) -> dict[float, float]:
    """Cumulative counts by upper bound (``le``), summed over the model's other labels
    (but the batch class: batch lines have no SLO of their own)."""
    out: dict[float, float] = defaultdict(float)
    for (n, labels), value in scrape.series.items():
        tags = dict(labels)
        if (
            n == f"{name}_bucket"
            and tags.get("model") == model
            and (tags.get("tenant_class") != "batch")
        ):
            out[float(tags["le"])] += value
    return out


def _delta_buckets(
    before: Scrape, after: Scrape, name: str, model: str
) -> list[tuple[float, float]]:
    old = _buckets(before, name, model)
    new = _buckets(after, name, model)
    return sorted((bound, max(0.0, count - old.get(bound, 0.0))) for bound, count in new.items())


def share_under(buckets: list[tuple[float, float]], limit: float) -> float | None:
    """The share of observations at or under ``limit``; None with no observation."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0:
        return None
    lower_bound, lower_count = 0.0, 0.0
    for bound, count in buckets:
        if limit <= bound:
            if math.isinf(bound):
                return lower_count / total
            inside = (limit - lower_bound) / (bound - lower_bound)
            return (lower_count + inside * (count - lower_count)) / total
        lower_bound, lower_count = bound, count
    return 1.0


def quantiles(buckets: list[tuple[float, float]], points: int) -> list[int]:
    """``points`` values at evenly spaced quantiles, linear inside each bucket."""
    total = buckets[-1][1] if buckets else 0.0
    if total <= 0 or points <= 0:
        return []
    values, lower_bound, lower_count, at = [], 0.0, 0.0, 0
    for bound, count in buckets:
        top = lower_bound * 2 if math.isinf(bound) else bound  # past the last bound: a guess
        while at < points and (at + 0.5) / points * total <= count:
            share = ((at + 0.5) / points * total - lower_count) / max(count - lower_count, 1e-9)
            values.append(max(1, round(lower_bound + share * (top - lower_bound))))
            at += 1
        lower_bound, lower_count = bound, count
    return values


def interval_sample(before: Scrape, after: Scrape, *, model: str, slo: Slo,
                    max_lengths: int = 256) -> IntervalSample:  # fmt: skip
    prompts = _delta_buckets(before, after, "pdserve_request_prompt_tokens", model)
    outputs = _delta_buckets(before, after, "pdserve_request_output_tokens", model)
    answered = int(prompts[-1][1]) if prompts else 0
    points = min(answered, max_lengths)
    inputs, outs = quantiles(prompts, points), quantiles(outputs, points)
    # Matched by a fixed stride (coprime with the count): a shuffle, the same every time.
    stride = next(s for s in (7919, 104729, 1) if points <= 1 or math.gcd(s, points) == 1)
    lengths = tuple((inputs[i], outs[(i * stride) % len(outs)]) for i in range(len(inputs))
                    if outs)  # fmt: skip
    ttft = share_under(_delta_buckets(before, after, "pdserve_time_to_first_token_seconds", model),
                       slo.ttft_s)  # fmt: skip
    itl = share_under(_delta_buckets(before, after, "pdserve_time_per_output_token_seconds", model),
                      slo.itl_s)  # fmt: skip
    met = (1.0 if ttft is None else ttft) * (1.0 if itl is None else itl)
    queries = _delta(before, after, "pdserve_pool_prefix_cache_queries_total", model, "prefill")
    hits = _delta(before, after, "pdserve_pool_prefix_cache_hits_total", model, "prefill")
    arrivals = _delta(before, after, "pdserve_arrivals_total", model)
    clumps = _delta_buckets(before, after, "pdserve_arrival_clump_size", model)
    return IntervalSample(
        end_s=after.at_s, duration_s=max(after.at_s - before.at_s, 1e-9),
        arrivals=max(0, round(arrivals)), lengths=lengths,
        met_slo=round(met * len(lengths)),
        input_tokens=max(0, round(queries)), cached_tokens=max(0, round(min(hits, queries))),
        measured_prefill=measured_curve(after, model, _PREFILL_FIT),
        measured_handoff=measured_curve(after, model, _HANDOFF_FIT),
        pressure=pressure(before, after, model=model),
        clump_sizes=tuple(quantiles(clumps, min(max_lengths, int(clumps[-1][1]) if clumps else 0))),
    )  # fmt: skip


def pressure(before: Scrape, after: Scrape, *, model: str) -> Pressure:
    """Work waiting now, the decode pool's KV and preemptions, and batch lines due."""
    waiting = _sum(after, "pdserve_prefill_queue_waiting_requests", model=model) + (
        _shared(after, "pdserve_pool_queue_depth", model=model, pool="prefill") or 0.0
    )
    preempted = _delta(before, after, "pdserve_pool_preemptions_total", model, "decode")
    usage = _shared(after, "pdserve_pool_kv_cache_usage_perc", model=model, pool="decode")
    return Pressure(
        waiting_requests=waiting,
        decode_kv_usage=usage,
        decode_preemptions=max(0, round(preempted)),
        batch=batch_due(after, model=model),
    )


def batch_due(scrape: Scrape, *, model: str) -> Load | None:
    """The running batches' lines of the model as a load: the pace their deadlines need,
    at their mean (estimated) prompt and output lengths; None without such lines."""
    lines = _sum(scrape, "pdserve_batch_pending_lines", model=model)
    due = _sum(scrape, "pdserve_batch_due_lines_per_second", model=model)
    if lines < 1 or due <= 0:
        return None
    prompt = _sum(scrape, "pdserve_batch_pending_tokens", model=model, direction="input")
    output = _sum(scrape, "pdserve_batch_pending_tokens", model=model, direction="output")
    mean = (max(1, round(prompt / lines)), max(1, round(output / lines)))
    return Load(rate_per_s=due, lengths=(mean,), prefix_hit=0.0)


def worker_usd_per_hour(before: Scrape, after: Scrape, *, model: str, pool: str) -> float | None:
    """What a worker of the model's pool (prefill or decode) cost an hour over the interval,
    at the router's cost model (its ``worker_cost_usd_per_hour`` by worker kind: the pools
    may run on different kinds); None before any worker time there."""
    usd = _delta(before, after, "pdserve_cost_usd_total", model, pool)
    seconds = _delta(before, after, "pdserve_worker_seconds_total", model, pool)
    return usd / seconds * 3600 if seconds > 0 else None
