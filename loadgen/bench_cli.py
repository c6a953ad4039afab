"""``pdserve bench``: load-test any OpenAI-compatible endpoint, open-loop, with SLO goodput.

    pdserve bench --url http://127.0.0.1:8000 --model tiny-llama \\
        --dataset shared-prefix --arrival poisson --rates 2 4 8 --slo-ttft-ms 500

Writes, under ``--out``: one JSON per run (summary, the cluster's own view, every
request's timings) and ``report.html`` comparing the runs of this invocation plus any
``--compare`` JSONs. Every run stops by itself: ``--num-requests`` and
``--duration-s`` are capped, and only ``--url`` is ever called.

``--endpoint embeddings`` drives ``/v1/embeddings`` instead: each request is a list of
``--inputs-per-request`` texts of random lengths (``--input-len``, ``--range-ratio``,
``--len-dist``), timed end to end; the report gives latency percentiles, requests/s
and input tokens/s (``total_token_throughput``).

    pdserve bench --url http://127.0.0.1:8000 --model all-minilm-l6-v2 \
        --endpoint embeddings --input-len 64 --len-dist lognormal --range-ratio 0.8 \
        --inputs-per-request 8 --max-concurrency 4 --rates inf
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from contracts.machine import machine_record
from contracts.tokenization import load_tokenizer
from loadgen import datasets
from loadgen.arrivals import ARRIVALS, send_times
from loadgen.client import RequestResult, embed_request, stream_request
from loadgen.cluster_view import ClusterWatch
from loadgen.metrics import SLO, summarize
from loadgen.replay import Scheduled, replay
from loadgen.report import write_report
from loadgen.traces import DEFAULT_TRACE

MAX_REQUESTS = 100_000
MAX_DURATION_S = 3600
MAX_INPUTS_PER_REQUEST = 2048
PATHS = {"completions": "/v1/completions", "chat": "/v1/chat/completions",
         "embeddings": "/v1/embeddings"}  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    target = parser.add_argument_group("target")
    target.add_argument("--url", required=True, help="base URL of the OpenAI-compatible API")
    target.add_argument("--model", required=True, help="model name to request")
    target.add_argument("--endpoint", choices=list(PATHS), default="completions")
    target.add_argument("--tokenizer", default=None,
                        help="tiny, smollm2 or a model folder (default: from --model)")  # fmt: skip
    target.add_argument("--api-key", default=None)
    data = parser.add_argument_group("dataset")
    data.add_argument("--dataset", choices=datasets.DATASETS, default="random")
    data.add_argument("--num-requests", type=int, default=200)
    data.add_argument("--input-len", type=int, default=256)
    data.add_argument("--output-len", type=int, default=32)
    data.add_argument("--range-ratio", type=float, default=0.0,
                      help="uniform: len x (1 +- ratio); lognormal: sigma")  # fmt: skip
    data.add_argument("--len-dist", choices=datasets.LENGTH_DISTRIBUTIONS, default="uniform")
    data.add_argument("--inputs-per-request", type=int, default=1, help="embeddings: texts")
    data.add_argument("--max-input-len", type=int, default=None,
                      help="embeddings: longest input (default: the model's context)")  # fmt: skip
    data.add_argument("--groups", type=int, default=8, help="shared-prefix: system prompts")
    data.add_argument("--system-len", type=int, default=512)
    data.add_argument("--question-len", type=int, default=64)
    data.add_argument("--sessions", type=int, default=20, help="multi-turn sessions")
    data.add_argument("--turns", type=int, default=5)
    data.add_argument("--turn-len", type=int, default=64)
    data.add_argument("--turn-gap-s", type=float, default=2.0)
    data.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="mooncake trace")
    data.add_argument("--trace-speed", type=float, default=1.0)
    data.add_argument("--length-scale", type=float, default=1.0)
    data.add_argument("--output-scale", type=float, default=1.0)
    data.add_argument("--jsonl", type=Path, default=None, help="jsonl dataset file")
    load = parser.add_argument_group("load")
    load.add_argument("--arrival", choices=ARRIVALS, default="poisson")
    load.add_argument("--rates", type=float, nargs="+", default=[4.0],
                      help="requests/s; several: a sweep, one run each")  # fmt: skip
    load.add_argument("--burstiness", type=float, default=1.0, help="gamma shape")
    load.add_argument("--max-concurrency", type=int, default=None)
    load.add_argument("--duration-s", type=float, default=300.0, help="cap per run")
    load.add_argument("--seed", type=int, default=0)
    slo = parser.add_argument_group("SLOs (goodput counts requests meeting all given)")
    slo.add_argument("--slo-ttft-ms", type=float, default=None)
    slo.add_argument("--slo-tpot-ms", type=float, default=None)
    slo.add_argument("--slo-e2e-ms", type=float, default=None)
    out = parser.add_argument_group("output")
    out.add_argument("--label", default=None, help="run name in the report")
    out.add_argument("--out", type=Path, default=Path("benchmarks/results/bench"))
    out.add_argument("--compare", type=Path, nargs="*", default=[],
                     help="earlier run JSONs to put side by side in the report")  # fmt: skip


def build_requests(args: argparse.Namespace) -> list[datasets.BenchRequest]:
    if args.dataset == "jsonl":
        if args.jsonl is None:
            raise SystemExit("--dataset jsonl needs --jsonl FILE")
        return datasets.jsonl_prompts(args.jsonl, limit=args.num_requests,
                                      default_output_len=args.output_len)  # fmt: skip
    folder = _tokenizer_folder(args)
    tokenizer = load_tokenizer(str(folder))
    if args.endpoint == "embeddings":
        if args.dataset != "random":
            raise SystemExit("--endpoint embeddings takes --dataset random or jsonl")
        longest = args.max_input_len or _context_words(folder, tokenizer)
        requests, cut = datasets.embedding_inputs(
            datasets.WordSource(tokenizer), args.num_requests, input_len=args.input_len,
            range_ratio=args.range_ratio, len_dist=args.len_dist,
            inputs_per_request=args.inputs_per_request, max_input_len=longest, seed=args.seed,
        )  # fmt: skip
        if cut:
            print(f"embeddings: {cut} input lengths cut to {longest} tokens", file=sys.stderr)
        return requests
    if args.dataset == "mooncake":
        return datasets.mooncake_prompts(
            tokenizer, args.trace, limit=args.num_requests, speed=args.trace_speed,
            length_scale=args.length_scale, output_scale=args.output_scale,
        )  # fmt: skip
    words = datasets.WordSource(tokenizer)
    if args.dataset == "random":
        return datasets.random_prompts(
            words, args.num_requests, input_len=args.input_len, output_len=args.output_len,
            range_ratio=args.range_ratio, seed=args.seed, len_dist=args.len_dist,
        )  # fmt: skip
    if args.dataset == "shared-prefix":
        per_group = max(1, args.num_requests // args.groups)
        return datasets.shared_prefix_prompts(
            words, groups=args.groups, prompts_per_group=per_group, system_len=args.system_len,
            question_len=args.question_len, output_len=args.output_len, seed=args.seed,
        )  # fmt: skip
    sessions = max(1, args.num_requests // args.turns)
    starts = send_times(sessions, process=_process(args), rate=args.rates[0],
                        burstiness=args.burstiness, seed=args.seed)  # fmt: skip
    return datasets.multi_turn_prompts(
        words, sessions=sessions, turns=args.turns, first_len=args.input_len,
        turn_len=args.turn_len, output_len=args.output_len, session_starts=starts,
        turn_gap_s=args.turn_gap_s, seed=args.seed,
    )  # fmt: skip


def _tokenizer_folder(args: argparse.Namespace) -> Path:
    from modelstore.known import KNOWN, resolve

    name = args.tokenizer
    if name is None:
        name = next((k for k, m in KNOWN.items() if args.model == m.SERVED_NAME), None)
        if name is None:
            raise SystemExit("--tokenizer is needed to build prompts for this model")
    return resolve(name)[0]


def _context_words(folder: Path, tokenizer) -> int:
    """The model's context less the special tokens the tokenizer adds to every input.
    A sentence-transformers folder's ``max_seq_length`` wins, as it does in vLLM."""
    sentence_config = folder / "sentence_bert_config.json"
    context = None
    if sentence_config.exists():
        context = json.loads(sentence_config.read_text()).get("max_seq_length")
    if context is None:
        context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
    return (context or 512) - len(tokenizer.encode("", add_special_tokens=True))


def _process(args: argparse.Namespace) -> str:
    return "poisson" if args.arrival == "trace" else args.arrival


def schedule_for(
    requests: list[datasets.BenchRequest], args: argparse.Namespace, rate: float
) -> tuple[list[Scheduled], float, str]:
    """Send times (the dataset's own, or the arrival process at ``rate``) and the offered rate."""
    own_times = all(r.send_at_s is not None for r in requests)
    if args.arrival == "trace" or (own_times and args.dataset in ("mooncake", "multi-turn")):
        if not own_times:
            raise SystemExit(f"--arrival trace needs a dataset with timestamps, not {args.dataset}")
        times = [r.send_at_s or 0.0 for r in requests]
    else:
        times = send_times(len(requests), process=args.arrival, rate=rate,
                           burstiness=args.burstiness, seed=args.seed)  # fmt: skip
    schedule = []
    for when, request in sorted(zip(times, requests, strict=True), key=lambda pair: pair[0]):
        payload = dict(request.payload)
        if args.endpoint == "chat" and "prompt" in payload:
            payload["messages"] = [{"role": "user", "content": payload.pop("prompt")}]
        sampling = {} if args.endpoint == "embeddings" else {"temperature": 0, "ignore_eos": True}
        schedule.append(Scheduled(when, {"model": args.model, **payload, **sampling}))
    span_s = max(times) - min(times) if len(times) > 1 else 0.0
    offered = (len(times) - 1) / span_s if span_s > 0 else rate
    return schedule, offered, PATHS[args.endpoint]


class Progress:
    """One live line on stderr: done, rate, TTFT p50 so far (latency for embeddings), errors."""

    def __init__(self, label: str, total: int, *, whole_answer: bool = False) -> None:
        self._label, self._total = label, total
        self._done = self._errors = 0
        self._ttfts: list[float] = []
        self._started = time.perf_counter()
        self._shown = 0.0
        self._metric = "latency" if whole_answer else "TTFT"

    def __call__(self, result: RequestResult) -> None:
        self._done += 1
        first = result.e2e_s if self._metric == "latency" else result.ttft_s
        if result.ok and first is not None:
            self._ttfts.append(first)
        else:
            self._errors += 1
        now = time.perf_counter()
        if now - self._shown >= 0.5 or self._done == self._total:
            self._shown = now
            rate = self._done / max(now - self._started, 1e-9)
            ttft = sorted(self._ttfts)[len(self._ttfts) // 2] * 1000 if self._ttfts else 0.0
            filled = int(30 * self._done / max(self._total, 1))
            sys.stderr.write(
                f"\r{self._label} [{'=' * filled}{' ' * (30 - filled)}] {self._done}/{self._total}"
                f"  {rate:5.1f} req/s  {self._metric} p50 {ttft:7.1f} ms  errors {self._errors}"
            )
            if self._done == self._total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def run_once(args: argparse.Namespace, requests: list, rate: float) -> dict:
    schedule, offered, path = schedule_for(requests, args, rate)
    label = args.label or f"{args.dataset}-{args.arrival}"
    if len(args.rates) > 1:
        label = f"{label}@{rate:g}"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    embeddings = args.endpoint == "embeddings"
    watch = ClusterWatch(args.url)
    watch.start()
    results = asyncio.run(replay(
        args.url.rstrip("/") + path, schedule, max_concurrency=args.max_concurrency,
        deadline_s=min(args.duration_s, MAX_DURATION_S), headers=headers,
        on_result=Progress(label, len(schedule), whole_answer=embeddings),
        send=embed_request if embeddings else stream_request,
    ))  # fmt: skip
    cluster = watch.stop()
    slo = SLO(args.slo_ttft_ms, args.slo_tpot_ms, args.slo_e2e_ms)
    argv = sys.argv[2:] if sys.argv[1:2] == ["bench"] else sys.argv[1:]
    hidden = ("run", "api_key", "compare")
    config = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
              if k not in hidden}  # fmt: skip
    samples = [
        {"start_s": r.started_s, "status": r.status, "error": r.error,
         "ttft_ms": None if r.ttft_s is None else r.ttft_s * 1000,
         "tpot_ms": None if r.tpot_s is None else r.tpot_s * 1000,
         "e2e_ms": r.e2e_s * 1000, "output_tokens": r.output_tokens,
         "prompt_tokens": r.prompt_tokens}
        for r in results
    ]  # fmt: skip
    return {
        "label": label,
        "series": args.label or f"{args.dataset}-{args.arrival}",
        "offered_rps": offered,
        "machine": machine_record(),
        "command": "pdserve bench " + " ".join(argv),
        "config": config,
        "slo": {"ttft_ms": slo.ttft_ms, "tpot_ms": slo.tpot_ms, "e2e_ms": slo.e2e_ms},
        "summary": summarize(results, slo),
        "cluster": cluster,
        "samples": samples,
    }


def main(args: argparse.Namespace) -> int:
    if not 1 <= args.num_requests <= MAX_REQUESTS:
        raise SystemExit(f"--num-requests must be between 1 and {MAX_REQUESTS}")
    if not 0 < args.duration_s <= MAX_DURATION_S:
        raise SystemExit(f"--duration-s must be in (0, {MAX_DURATION_S}]")
    if not 1 <= args.inputs_per_request <= MAX_INPUTS_PER_REQUEST:
        raise SystemExit(f"--inputs-per-request must be between 1 and {MAX_INPUTS_PER_REQUEST}")
    runs = []
    args.out.mkdir(parents=True, exist_ok=True)
    rates = [None] if args.arrival == "trace" else args.rates
    for index, rate in enumerate(rates):
        # Each rate of a sweep gets fresh prompts (but the same shapes): otherwise the
        # later rates would run on prefixes the earlier ones left cached.
        rate_args = argparse.Namespace(**{**vars(args), "seed": args.seed + index})
        requests = build_requests(rate_args)
        run = run_once(rate_args, requests, rate or args.rates[0])
        path = args.out / f"{_file_name(run['label'])}.json"
        path.write_text(json.dumps(run, indent=1) + "\n")
        print(f"{_one_line(run, args.endpoint)} -> {path}")
        runs.append(run)
    runs += [json.loads(p.read_text()) for p in args.compare]
    report = write_report(runs, args.out, title=f"pdserve bench: {args.url}")
    print(f"report: {report}")
    return 0


def _one_line(run: dict, endpoint: str) -> str:
    summary = run["summary"]
    head = (f"{run['label']}: {summary['succeeded']}/{summary['requests']} ok, "
            f"{summary['request_throughput']:.2f} req/s, ")  # fmt: skip
    if endpoint == "embeddings":
        e2e = summary["e2e_ms"]
        return (head + f"{summary['total_token_throughput']:.0f} input tokens/s, latency p50 "
                f"{e2e['p50'] or 0:.1f} ms p99 {e2e['p99'] or 0:.1f} ms")  # fmt: skip
    ttft = summary["ttft_ms"]
    return (head + f"TTFT p50 {ttft['p50'] or 0:.1f} ms p99 {ttft['p99'] or 0:.1f} ms, "
            f"goodput {summary['goodput']:.2f} req/s")  # fmt: skip


def _file_name(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_.@" else "_" for c in label)
