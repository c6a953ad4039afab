"""``pdserve agent-token``: what a Kubernetes init container runs to hand its agent a token
in a file (deploy/k8s), the secret staying in the init container."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

from contracts.agent_tokens import verified_worker


def test_the_token_goes_to_an_owner_only_file_and_verifies_for_that_worker(tmp_path):
    out = tmp_path / "agent-token"
    env = {**os.environ, "PDSERVE_AGENT_SECRET": "s3cret"}
    run = subprocess.run(
        [sys.executable, "-m", "cli.main", "agent-token", "decode-7f9c", "--out", str(out)],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""  # nothing on stdout, so nothing in the pod's log
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    assert verified_worker("s3cret", out.read_text().strip()) == "decode-7f9c"


def test_without_the_secret_it_refuses(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "PDSERVE_AGENT_SECRET"}
    run = subprocess.run(
        [sys.executable, "-m", "cli.main", "agent-token", "w", "--out", str(tmp_path / "t")],
        env=env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert run.returncode != 0 and "PDSERVE_AGENT_SECRET" in run.stderr
    assert not (tmp_path / "t").exists()
