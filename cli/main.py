"""``pdserve``: one console script, one subcommand per process kind."""

from __future__ import annotations

import argparse
import sys

AGENT_COMMANDS = ("prefill", "decode", "colocated")


def build_parser() -> argparse.ArgumentParser:
    from agent.roles import colocated, decode, prefill
    from cli import admin, agent_token, launcher, model_prep, status
    from loadgen import bench_cli, calibrate_cli
    from router.http import server
    from sim import cli as sim_cli

    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    for name, module, summary in (
        ("up", launcher, "start a local cluster: router + prefill + decode workers"),
        ("router", server, "run the router (OpenAI API + admin)"),
        ("prefill", prefill, "run a prefill agent supervising one vLLM (kv_producer)"),
        ("decode", decode, "run a decode agent supervising one vLLM (kv_consumer)"),
        ("colocated", colocated, "run a colocated agent: one plain vLLM, no P/D"),
        ("sim", sim_cli, "run simulated vLLM servers (GPU-free, calibrated timing)"),
        ("model", model_prep, "prepare a model into ~/.cache/pdserve"),
        ("bench", bench_cli, "load-test an OpenAI-compatible endpoint; JSON + HTML report"),
        ("admin", admin, "the SRE admin API: pools, P:D ratio changes, drains, audit"),
        ("agent-token", agent_token, "mint a worker's agent token from PDSERVE_AGENT_SECRET"),
        ("status", status, "a live view of models, pools, workers, TTFT, tokens/s and cost"),
    ):
        sub = commands.add_parser(name, help=summary, description=summary)
        if module is sim_cli:
            calibrate = ("calibrate", "measure a real vLLM and fit a timing profile to it",
                         calibrate_cli)  # fmt: skip
            sim_cli.add_arguments(sub, subcommands=[calibrate])
        else:
            module.add_arguments(sub)
        sub.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command in AGENT_COMMANDS and args.engine == "sim":
        # The engine kind is chosen here, at the edge: the agent gets the sim's facts.
        from localrun.sim_engine import sim_facts

        args.sim_facts = sim_facts(args.sim_profile)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
