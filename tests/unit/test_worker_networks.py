"""Where a worker may be: hosts inside ``allowed_worker_networks`` only, names resolved at
registration and trusted on the request path only once seen there; the token files the
launcher writes, private from their first byte; a sim beyond loopback needs a token."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest

from cli.main import main as cli_main
from localrun.cluster import write_private
from router.fleet.worker_networks import OutsideNetworks, WorkerNetworks
from router.orchestration.orchestrate import InvalidHandoff, _handoff_in

LOOPBACK = ("127.0.0.0/8", "::1/128")


async def test_engine_hosts_inside_the_networks_pass_and_others_are_refused():
    networks = WorkerNetworks(LOOPBACK)
    for url in ("http://127.0.0.1:8000", "http://127.9.9.9:1", "http://[::1]:8000",
                "tcp://127.0.0.1:5557", "http://localhost:8000"):  # fmt: skip
        await networks.check_url(url, "engine_url")
    for url in ("http://10.0.0.5:8000", "http://[2001:db8::1]:1", "http://0.0.0.0:8000",
                "http://no-such-host.invalid:80", "http://:80"):  # fmt: skip
        with pytest.raises(OutsideNetworks):
            await networks.check_url(url, "engine_url")
    wide = WorkerNetworks(("10.0.0.0/8",))
    await wide.check_url("http://10.2.3.4:8000", "engine_url")
    with pytest.raises(OutsideNetworks, match=r"10\.0\.0\.0/8"):
        await wide.check_url("http://127.0.0.1:8000", "engine_url")


async def test_a_name_is_trusted_on_the_request_path_only_once_a_registration_resolved_it():
    networks = WorkerNetworks(LOOPBACK, max_names=1)
    assert networks.allows("127.0.0.1") and not networks.allows("10.0.0.1")
    assert not networks.allows("localhost")  # never resolved: no lookup on the hot path
    await networks.check_url("http://localhost:1", "engine_url")
    assert networks.allows("localhost")
    with pytest.raises(OutsideNetworks):
        await networks.check_url("http://no-such-host.invalid:1", "engine_url")
    assert not networks.allows("localhost")  # bounded: the newest name pushed it out


def test_a_handoff_naming_a_host_outside_the_networks_is_refused():
    params = {"do_remote_prefill": True, "do_remote_decode": False, "remote_engine_id": "e",
              "remote_block_ids": [1], "remote_host": "127.0.0.1", "remote_port": 5600,
              "remote_request_id": "r"}  # fmt: skip
    networks = WorkerNetworks(LOOPBACK)
    payload = json.dumps({"kv_transfer_params": params}).encode()
    assert _handoff_in(payload, issued_at_s=0, networks=networks).remote_host == "127.0.0.1"
    far = json.dumps({"kv_transfer_params": {**params, "remote_host": "203.0.113.9"}}).encode()
    with pytest.raises(InvalidHandoff, match="outside allowed_worker_networks"):
        _handoff_in(far, issued_at_s=0, networks=networks)


def test_a_token_file_is_private_from_its_first_byte(tmp_path: Path):
    previous = os.umask(0)  # the most permissive umask: the mode must not come from it
    try:
        write_private(tmp_path / "admin_token", "secret")
        write_private(tmp_path / "admin_token", "rotated")
    finally:
        os.umask(previous)
    token = tmp_path / "admin_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.read_text() == "rotated"
    assert [p.name for p in tmp_path.iterdir()] == ["admin_token"]  # no temporary left


def test_a_sim_refuses_to_bind_beyond_loopback_without_a_token(monkeypatch, tmp_path: Path):
    monkeypatch.delenv("PDSERVE_SIM_ADMIN_TOKEN", raising=False)
    argv = ["sim", "--model", str(tmp_path), "--served-model-name", "m", "--port", "9",
            "--host", "0.0.0.0"]  # fmt: skip
    with pytest.raises(SystemExit, match="PDSERVE_SIM_ADMIN_TOKEN"):
        cli_main(argv)
