"""``pdserve admin``: the SRE's admin API from a terminal: pools, ratio, drain, audit, and
versions in production (models, route, policy, promote, rollback, approve, review).

The router URL and token come from flags, else ``PDSERVE_ROUTER_URL`` and
``PDSERVE_ADMIN_TOKEN``, else the newest run folder ``pdserve up`` wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from modelstore.checksum import folder_checksum

RUNS = Path(".pdserve") / "runs"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--router-url", default=os.environ.get("PDSERVE_ROUTER_URL"))
    parser.add_argument("--token", default=os.environ.get("PDSERVE_ADMIN_TOKEN"))
    parser.add_argument("--run-dir", type=Path, default=None, help="default: the newest run")
    actions = parser.add_subparsers(dest="action", required=True)
    actions.add_parser("pools", help="models, P:D counts and targets, workers and their state")
    ratio = actions.add_parser("ratio", help="change a model's P:D counts and wait for it")
    ratio.add_argument("model")
    ratio.add_argument("--prefill", type=int, required=True)
    ratio.add_argument("--decode", type=int, required=True)
    ratio.add_argument("--timeout-s", type=float, default=1800)
    for name in ("drain", "undrain"):
        action = actions.add_parser(name, help=f"{name} one worker")
        action.add_argument("worker")
    audit = actions.add_parser("audit", help="who changed what, and how it ended")
    audit.add_argument("--limit", type=int, default=50)
    batches = actions.add_parser("batches", help="every tenant's batches; --cancel to cancel one")
    batches.add_argument("--limit", type=int, default=100)
    batches.add_argument("--cancel", metavar="BATCH_ID")
    _add_rollout_actions(actions)


def _add_rollout_actions(actions: argparse._SubParsersAction) -> None:
    models = actions.add_parser("models", help="registered versions, or register one")
    models.add_argument("--register", nargs=2, metavar=("MODEL_ID", "VERSION"))
    models.add_argument("--artifact", help="folder or URI of the version to register")
    models.add_argument("--max-context", type=int, default=4096)
    models.add_argument("--tokenizer", help="default: the artifact")
    models.add_argument("--checksum", help="sha256:<hex>; default: computed from the folder")
    route = actions.add_parser("route", help="show a model's route, or change its stages")
    route.add_argument("model")
    route.add_argument("--prod", help="the prod version (default: unchanged)")
    route.add_argument("--canary", help="a canary version")
    route.add_argument("--weight", type=float, default=0.1, help="the canary's share")
    route.add_argument(
        "--prepull",
        type=int,
        default=0,
        metavar="N",
        help="pull the canary's version on N workers before it gets traffic",
    )
    route.add_argument("--sticky", choices=["api_key", "user", "header"], default="api_key")
    route.add_argument("--shadow", help="a shadow version")
    route.add_argument("--sample-rate", type=float, default=0.1, help="share mirrored")
    policy = actions.add_parser(
        "policy", help="show a model's policy, or change it (loosening it needs a reviewer)"
    )
    policy.add_argument("model")
    policy.add_argument(
        "--require-approval",
        action=argparse.BooleanOptionalAction,
        help="versions serve prod (and heavy canaries) only once approved",
    )
    policy.add_argument("--max-unapproved-canary-weight", type=float,
                        help="the heaviest canary an unapproved version may take")  # fmt: skip
    for name, text in (("promote", "make the canary prod (gate, approval)"),
                       ("rollback", "drop the canary")):  # fmt: skip
        actions.add_parser(name, help=text).add_argument("model")
    approve = actions.add_parser("approve", help="(reviewer) approve or refuse a version")
    approve.add_argument("model")
    approve.add_argument("version")
    approve.add_argument("--refuse", action="store_true")
    approve.add_argument("--note", default="")
    review = actions.add_parser("review", help="(reviewer) flagged requests; --mark to mark one")
    review.add_argument("--limit", type=int, default=50)
    review.add_argument("--mark", nargs=2, metavar=("ITEM_ID", "MARK"))


def main(args: argparse.Namespace) -> int:
    url, token = endpoint(args)
    call = Caller(url, token)
    if args.action == "pools":
        _print_pools(call("GET", "/admin/v1/pools"))
    elif args.action == "ratio":
        return _change_ratio(call, args)
    elif args.action in ("drain", "undrain"):
        print(json.dumps(call("POST", f"/admin/v1/workers/{args.worker}/{args.action}")))
    elif args.action == "batches":
        _batches(call, args)
    elif args.action == "audit":
        for e in call("GET", f"/admin/v1/audit?limit={args.limit}")["entries"]:
            when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["at_unix_s"]))
            print(f"{when}  {e['actor']:<12} {e['action']:<12} {e['target']:<24} {e['outcome']}")
    else:
        print(json.dumps(rollout_action(call, args), indent=2))
    return 0


def rollout_action(call: Caller, args: argparse.Namespace) -> Any:
    route = f"/admin/v1/routes/{getattr(args, 'model', '')}"
    if args.action == "models":
        if args.register:
            return call("POST", "/admin/v1/models", _artifact(args))
        return call("GET", "/admin/v1/models")
    if args.action == "route":
        if not any((args.prod, args.canary, args.shadow)):
            return call("GET", route)
        return call("PUT", route, _route_body(call, route, args))
    if args.action == "policy":
        return _policy_change(call, args)
    if args.action in ("promote", "rollback"):
        return call("POST", f"{route}/{args.action}")
    if args.action == "approve":
        decision = "refuse" if args.refuse else "approve"
        return call("POST", f"{route}/approve",
                    {"version": args.version, "decision": decision, "note": args.note})  # fmt: skip
    if args.mark:
        return call("POST", f"/admin/v1/review/{args.mark[0]}", {"mark": args.mark[1]})
    return call("GET", f"/admin/v1/review?limit={args.limit}")


def _batches(call: Caller, args: argparse.Namespace) -> None:
    if args.cancel:
        print(json.dumps(call("POST", f"/admin/v1/batches/{args.cancel}/cancel"), indent=2))
        return
    for b in call("GET", f"/admin/v1/batches?limit={args.limit}")["data"]:
        counts = b["request_counts"]
        created = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(b["created_at"]))
        print(
            f"{b['id']}  {created}  {b['tenant'] or '-':<12} {b['status']:<11} "
            f"{counts['completed']}+{counts['failed']}/{counts['total']}  {b['endpoint']}"
            + _progress(b)
        )


def _progress(batch: dict[str, Any]) -> str:
    """A running batch's pace, backlog and time left, and whether it is at risk."""
    p = batch.get("progress")
    if not p or batch["status"] != "in_progress":
        return ""
    left = "" if p["seconds_left"] is None else f", {p['seconds_left'] / 60:.0f} min left"
    risk = "  AT RISK" if batch.get("at_risk") else ""
    return (f"  {p['lines_per_s']:.1f} lines/s, backlog {p['backlog_tokens']} tokens, "
            f"{p['in_flight']}/{p['pace_limit']} in flight{left}{risk}")  # fmt: skip


def _route_body(call: Caller, route: str, args: argparse.Namespace) -> dict[str, Any]:
    """The current route with the flags' changes (a new route needs ``--prod``)."""
    current: dict[str, Any] = {}
    if not args.prod:
        current = call("GET", route)["spec"]
    body = {**current, "prod": args.prod or current.get("prod")}
    if args.canary:
        body["canary"] = {"version": args.canary, "weight": args.weight, "stickiness": args.sticky,
                          "prepull_workers": args.prepull}  # fmt: skip
    if args.shadow:
        body["shadow"] = {"version": args.shadow, "sample_rate": args.sample_rate}
    return body


def _policy_change(call: Caller, args: argparse.Namespace) -> Any:
    """The current policy with the flags' changes (the safety checks are kept as they are:
    edit them through the API)."""
    path = f"/admin/v1/policies/{args.model}"
    current = call("GET", path)["policy"]
    changes = {"requires_approval": args.require_approval,
               "max_unapproved_canary_weight": args.max_unapproved_canary_weight}  # fmt: skip
    changes = {name: value for name, value in changes.items() if value is not None}
    return call("PUT", path, {**current, **changes}) if changes else current


def _artifact(args: argparse.Namespace) -> dict[str, Any]:
    model_id, version = args.register
    if not args.artifact:
        raise SystemExit("--register needs --artifact (a folder or URI)")
    checksum = args.checksum
    if checksum is None:
        try:
            checksum = folder_checksum(Path(args.artifact))
        except FileNotFoundError as error:
            raise SystemExit(str(error)) from None
    return {"model_id": model_id, "version": version, "artifact": args.artifact,
            "max_context": args.max_context, "tokenizer": args.tokenizer or args.artifact,
            "checksum": checksum}  # fmt: skip


class Caller:
    def __init__(self, url: str, token: str) -> None:
        self._url, self._token = url.rstrip("/"), token

    def __call__(self, method: str, path: str, body: dict | None = None) -> Any:
        request = urllib.request.Request(
            self._url + path, method=method,
            data=None if body is None else json.dumps(body).encode(),
            headers={"Authorization": f"Bearer {self._token}",
                     "Content-Type": "application/json"},
        )  # fmt: skip
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                return json.load(response)
        except urllib.error.HTTPError as error:
            detail = json.loads(error.read() or b"{}").get("error", {})
            raise SystemExit(f"{method} {path}: {error.code} {detail.get('message', '')}") from None
        except OSError as error:
            raise SystemExit(f"router unreachable at {self._url}: {error}") from None


def endpoint(args: argparse.Namespace) -> tuple[str, str]:
    url, token = args.router_url, args.token
    if url and token:
        return url, token
    runs = [args.run_dir] if args.run_dir else sorted(RUNS.glob("*"), reverse=True)
    for run in runs:
        cluster = run / "cluster.json"
        if cluster.is_file():
            facts = json.loads(cluster.read_text())
            token = token or Path(facts["admin_token_file"]).read_text().strip()
            return url or facts["router_url"], token
    raise SystemExit("no router: pass --router-url and --token, or run `pdserve up` here first")


def _print_pools(pools: dict[str, Any]) -> None:
    for model, pool in pools["models"].items():
        target = pool["target"] or pool["counts"]
        print(f"{model}: prefill {pool['counts']['prefill']}/{target['prefill']}  "
              f"decode {pool['counts']['decode']}/{target['decode']}  (now/target)")  # fmt: skip
        print(f"  {'worker':<24}{'role':<11}{'state':<11}{'inflight':>9}{'running':>9}{'kv':>7}")
        for w in pool["workers"]:
            print(f"  {w['worker_id']:<24}{w['role']:<11}{w['state']:<11}"
                  f"{w['inflight_requests']:>9}{w['engine_running']:>9}"
                  f"{w['kv_cache_usage_perc']:>7.0%}")  # fmt: skip


def _change_ratio(call: Caller, args: argparse.Namespace) -> int:
    started = time.monotonic()
    answer = call("PUT", f"/admin/v1/pools/{args.model}",
                  {"prefill": args.prefill, "decode": args.decode})  # fmt: skip
    print(f"{answer['operation']}: {args.model} -> {args.prefill}P + {args.decode}D")
    while time.monotonic() - started < args.timeout_s:
        operation = call("GET", answer["status_url"])
        done = sum(1 for s in operation["steps"] if s["phase"] == "done")
        sys.stdout.write(f"\r  {operation['status']:<10} {done}/{len(operation['steps'])} "
                         f"workers re-roled, {time.monotonic() - started:5.0f}s")  # fmt: skip
        sys.stdout.flush()
        if operation["status"] != "running":
            print()
            return 0 if operation["status"] == "done" else 1
        time.sleep(1)
    print(f"\n  still running after {args.timeout_s:.0f}s; see {answer['status_url']}")
    return 1
