"""The session cluster's real engines, as the agents placed them: cores and sockets."""

from __future__ import annotations

import ipaddress

import psutil

from agent.placement import ExpectedPlacement, parse_cpu_list, placement_violations


def engine_processes(cluster, name: str) -> list[psutil.Process]:
    return psutil.Process(cluster.agents[name].pid).children(recursive=True)


def test_every_engine_thread_runs_on_its_workers_cores(cluster):
    for worker in cluster.workers:
        (engine,) = [p for p in engine_processes(cluster, worker.name)
                     if p.parent().pid == cluster.agents[worker.name].pid]  # fmt: skip
        cpus = parse_cpu_list(worker.cores)
        expected = ExpectedPlacement(cpus=cpus, model_thread_cpu=min(cpus))
        assert placement_violations(engine.pid, expected) == [], worker.name


def test_no_engine_listens_beyond_loopback(cluster):
    """KV events carry prompt token ids; NIXL's side channel its memory descriptors."""
    listening = []
    for worker in cluster.workers:
        pids = {p.pid for p in engine_processes(cluster, worker.name)}
        listening += [
            (worker.name, c.laddr.ip, c.laddr.port)
            for c in psutil.net_connections(kind="inet")
            if c.pid in pids and c.status == psutil.CONN_LISTEN
        ]
    kv_event_ports = {w.kv_events_port for w in cluster.workers}
    assert kv_event_ports & {port for _, _, port in listening}, "KV event sockets not found"
    assert [s for s in listening if not ipaddress.ip_address(s[1]).is_loopback] == []
