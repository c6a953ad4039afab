"""Every router, agent and sim process starts through ``pdserve``: it imports only the
subcommand it runs, so a worker does not pay for the others (matplotlib, the bench)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from cli.main import COMMANDS, build_parser


def modules_loaded_by(command: str) -> set[str]:
    code = (
        "import sys; from cli.main import build_parser; "
        f"build_parser({command!r}); print(' '.join(sys.modules))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True, timeout=60)  # fmt: skip
    return set(result.stdout.split())


@pytest.mark.parametrize("command", ["router", "prefill", "sim"])
def test_a_process_imports_only_its_own_subcommand(command):
    loaded = modules_loaded_by(command)
    assert not {"matplotlib", "loadgen.bench_cli", "cli.launcher", "cli.status"} & loaded


def test_every_subcommand_is_listed_and_parses_its_own_flags():
    listed = build_parser().format_help()
    assert all(c.name in listed for c in COMMANDS)
    args = build_parser("sim").parse_args(["sim", "--served-model-name", "m", "--port", "9"])
    assert (args.served_model_name, args.port) == ("m", 9)
