"""``pdserve``: one console script, one subcommand per process kind.

Only the chosen subcommand's module is imported: every router, agent and sim process
starts through here, and importing all of them (the benchmark report pulls in
matplotlib) cost each process about half a second of CPU.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from dataclasses import dataclass

AGENT_COMMANDS = ("prefill", "decode", "colocated", "embed")


@dataclass(frozen=True)
class Command:
    name: str
    module: str  # has add_arguments(parser) and main(args)
    summary: str


COMMANDS = (
    Command("up", "cli.launcher", "start a local cluster: router + prefill + decode workers"),
    Command("router", "router.http.server", "run the router (OpenAI API + admin)"),
    Command("prefill", "agent.roles.prefill",
            "run a prefill agent supervising one vLLM (kv_producer)"),
    Command("decode", "agent.roles.decode",
            "run a decode agent supervising one vLLM (kv_consumer)"),
    Command("colocated", "agent.roles.colocated", "run a colocated agent: one plain vLLM, no P/D"),
    Command("embed", "agent.roles.embed",
            "run an embedding agent: one vLLM pooling engine (/v1/embeddings)"),
    Command("sim", "sim.cli", "run simulated vLLM servers (GPU-free, calibrated timing)"),
    Command("model", "cli.model_prep", "prepare a model into ~/.cache/pdserve"),
    Command("bench", "loadgen.bench_cli",
            "load-test an OpenAI-compatible endpoint; JSON + HTML report"),
    Command("admin", "cli.admin", "the SRE admin API: pools, P:D ratio changes, drains, audit"),
    Command("agent-token", "cli.agent_token",
            "mint a worker's agent token from PDSERVE_AGENT_SECRET"),
    Command("status", "cli.status",
            "a live view of models, pools, workers, TTFT, tokens/s and cost"),
    Command("planner", "router.fleet.planner_service",
            "the SLO planner: recommend (or apply) the P/D split and fleet size from live load"),
    Command("plan", "cli.plan",
            "what-if: replay a trace on fleets of every size (sim); the frontier and a pick"),
)  # fmt: skip
SIM_CALIBRATE = Command(
    "calibrate", "loadgen.calibrate_cli", "measure a real vLLM and fit a timing profile to it"
)


def build_parser(chosen: str | None = None) -> argparse.ArgumentParser:
    """Every subcommand is listed; only ``chosen`` gets its flags (and is imported)."""
    parser = argparse.ArgumentParser(prog="pdserve", description=__doc__.split("\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    for command in COMMANDS:
        sub = commands.add_parser(command.name, help=command.summary, description=command.summary)
        if command.name != chosen:
            continue
        module = importlib.import_module(command.module)
        if command.name == "sim":
            calibrate = importlib.import_module(SIM_CALIBRATE.module)
            module.add_arguments(sub, subcommands=[(SIM_CALIBRATE.name, SIM_CALIBRATE.summary,
                                                    calibrate)])  # fmt: skip
        else:
            module.add_arguments(sub)
        sub.set_defaults(run=module.main)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # The top-level parser has no options of its own but -h: the first word is the command.
    chosen = next((word for word in argv if not word.startswith("-")), None)
    args = build_parser(chosen).parse_args(argv)
    if args.command in AGENT_COMMANDS and args.engine == "sim":
        # The engine kind is chosen here, at the edge: the agent gets the sim's facts.
        from localrun.sim_engine import sim_facts

        args.sim_facts = sim_facts(args.sim_profile)
    return args.run(args)


if __name__ == "__main__":
    sys.exit(main())
