"""A self-contained HTML report (plots inlined as PNG) comparing benchmark runs.

Each run is the JSON ``pdserve bench`` writes: a label, the offered rate, the
summary (metrics.py) and per-request samples. Plots: TTFT and TPOT CDFs, TTFT over
time, throughput against offered rate, and goodput against offered rate; then a
table of every metric, run by run. Also written: each plot as its own PNG. An
embeddings run has no first token: its latency (send to whole answer) takes TTFT's
place in the plots, labelled so.
"""

from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from contracts.machine import describe


def _cdf(axis, values: list[float], label: str) -> None:
    if values:
        ordered = sorted(values)
        axis.plot(ordered, [(i + 1) / len(ordered) for i in range(len(ordered))], label=label)


def _first_answer(run: dict) -> list[tuple[float, float]]:
    """(send time, ms to the first token, or to the whole answer for embeddings)."""
    key = "e2e_ms" if run.get("config", {}).get("endpoint") == "embeddings" else "ttft_ms"
    return [(s["start_s"], s[key]) for s in run["samples"]
            if s[key] is not None and (key == "ttft_ms" or s["error"] is None)]  # fmt: skip


def _figures(runs: list[dict]) -> dict[str, plt.Figure]:
    figures: dict[str, plt.Figure] = {}
    first = "TTFT"
    if any(r.get("config", {}).get("endpoint") == "embeddings" for r in runs):
        first = "TTFT or embedding latency"
    figure, (ttft, tpot) = plt.subplots(1, 2, figsize=(12, 4))
    for run in runs:
        samples = run["samples"]
        _cdf(ttft, [ms for _, ms in _first_answer(run)], run["label"])
        _cdf(tpot, [s["tpot_ms"] for s in samples if s["tpot_ms"] is not None], run["label"])
    for axis, name in ((ttft, first), (tpot, "TPOT")):
        axis.set_xscale("log")
        axis.set_xlabel(f"{name} (ms, log)")
        axis.set_ylabel("fraction of requests")
        axis.set_title(f"{name} CDF")
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    figures["latency_cdf"] = figure

    figure, axis = plt.subplots(figsize=(12, 4))
    for run in runs:
        points = _first_answer(run)
        axis.scatter([p[0] for p in points], [p[1] for p in points], s=6, label=run["label"])
    axis.set_yscale("log")
    axis.set_xlabel("send time (s)")
    axis.set_ylabel(f"{first} (ms, log)")
    axis.set_title(f"{first} over time")
    axis.legend()
    figures["ttft_over_time"] = figure

    figure, (throughput, goodput) = plt.subplots(1, 2, figsize=(12, 4))
    for label in dict.fromkeys(run["series"] for run in runs):
        series = sorted((r for r in runs if r["series"] == label), key=lambda r: r["offered_rps"])
        offered = [r["offered_rps"] for r in series]
        throughput.plot(offered, [r["summary"]["request_throughput"] for r in series], "o-",
                        label=label)  # fmt: skip
        goodput.plot(offered, [r["summary"]["goodput"] for r in series], "o-", label=label)
    for axis, name in ((throughput, "completed req/s"), (goodput, "goodput (req/s in SLO)")):
        axis.set_xlabel("offered req/s")
        axis.set_ylabel(name)
        if axis.get_legend_handles_labels()[0]:
            axis.legend()
    throughput.set_title("throughput against offered rate")
    goodput.set_title("goodput against offered rate")
    figures["throughput_goodput"] = figure
    for figure in figures.values():
        figure.tight_layout()
    return figures


def _png(figure: plt.Figure) -> bytes:
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100)
    plt.close(figure)
    return buffer.getvalue()


def _table(runs: list[dict]) -> str:
    rows = [("offered req/s", lambda s, r: r["offered_rps"])]
    for key in ("requests", "succeeded", "failed", "request_throughput",
                "output_token_throughput", "total_token_throughput", "goodput",
                "slo_attainment"):  # fmt: skip
        rows.append((key, lambda s, r, k=key: s[k]))
    for metric in ("ttft_ms", "tpot_ms", "itl_ms", "e2e_ms"):
        for stat in ("mean", "p50", "p90", "p99"):
            rows.append((f"{metric} {stat}", lambda s, r, m=metric, t=stat: s[m][t]))
    rows.append(("errors", lambda s, r: s["errors"] or "-"))

    def cell(value: object) -> str:
        if isinstance(value, float):
            return f"{value:,.2f}"
        return html.escape(str(value))

    head = "".join(f"<th>{html.escape(r['label'])}</th>" for r in runs)
    body = "".join(
        f"<tr><td>{html.escape(name)}</td>"
        + "".join(f"<td>{cell(get(r['summary'], r))}</td>" for r in runs)
        + "</tr>"
        for name, get in rows
    )
    return f"<table><tr><th>metric</th>{head}</tr>{body}</table>"


def write_report(runs: list[dict], out_dir: Path, title: str = "pdserve bench") -> Path:
    """``report.html`` plus one PNG per plot in ``out_dir``; returns the HTML path."""
    out_dir.mkdir(parents=True, exist_ok=True)
    images = []
    for name, figure in _figures(runs).items():
        png = _png(figure)
        (out_dir / f"{name}.png").write_bytes(png)
        images.append(f'<h2>{name.replace("_", " ")}</h2><img alt="{name}" '
                      f'src="data:image/png;base64,{base64.b64encode(png).decode()}">')  # fmt: skip
    commands = "".join(
        f"<li><code>{html.escape(r.get('command', ''))}</code><br>"
        f"{html.escape(describe(r['machine']) if r.get('machine') else 'machine not recorded')}"
        "</li>"
        for r in runs
    )
    page = f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}img{{max-width:100%}}</style>
</head><body><h1>{html.escape(title)}</h1><p>Definitions as in <code>vllm bench serve</code>:
TTFT send to first token; TPOT (E2E - TTFT) / (output tokens - 1); ITL gaps between tokens;
goodput: requests per second meeting every SLO.</p><ul>{commands}</ul>{_table(runs)}
{"".join(images)}</body></html>"""
    path = out_dir / "report.html"
    path.write_text(page)
    return path
