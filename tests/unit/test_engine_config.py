import argparse
import json
import sys

import pytest

from agent.engine_spec import CPU_IDLE_SPIN_S, ENGINE_SITE_DIR, EngineSpec, SimFacts
from agent.placement import ExpectedPlacement
from kvtransfer.transport import NixlTransport
from sim import cli as sim_cli


def transport(role="kv_producer", **kw):
    return NixlTransport(role=role, buffer_device="cpu", side_channel_port=5601, **kw)


def test_kv_transfer_config_names_the_connector_role_lease_and_load_failure_policy():
    config = json.loads(transport(kv_lease_s=45).kv_transfer_config())
    assert config == {
        "kv_connector": "NixlConnector",
        "kv_role": "kv_producer",
        "kv_buffer_device": "cpu",
        "kv_load_failure_policy": "recompute",
        "kv_connector_extra_config": {"kv_lease_duration": 45},
    }


def test_transport_env_stays_on_loopback_by_default():
    env = transport().env()
    assert env["UCX_NET_DEVICES"] == "lo"
    assert env["VLLM_NIXL_SIDE_CHANNEL_HOST"] == "127.0.0.1"
    assert env["VLLM_NIXL_SIDE_CHANNEL_PORT"] == "5601"
    assert "UCX_NET_DEVICES" not in transport(ucx_net_devices=None).env()
    assert "UCX_TLS" not in env  # UCX chooses unless told


def test_transport_names_ucx_transports_when_given():
    assert transport(ucx_transports="^sm").env()["UCX_TLS"] == "^sm"


@pytest.mark.parametrize(
    "kwargs",
    [
        {"side_channel_port": 0},
        {"side_channel_port": 65536},
        {"kv_lease_s": 5},
        {"progress_delay_us": -1},
        {"progress_delay_us": 2_000_000},
    ],
)
def test_transport_rejects_bad_values(kwargs):
    base = {"role": "kv_consumer", "buffer_device": "cpu", "side_channel_port": 5601}
    with pytest.raises(ValueError):
        NixlTransport(**{**base, **kwargs})


def spec(**kw):
    base = {"model_path": "/m", "served_model_name": "m", "port": 8100}
    return EngineSpec(**{**base, **kw})


def test_cpu_engine_is_eager_and_binds_cores_and_kv_size():
    s = spec(cores="1", kv_cache_gib=2, transport=transport("kv_consumer"))
    argv, env = s.argv(), s.env({})
    assert "--enforce-eager" in argv
    assert argv[argv.index("--host") + 1] == "127.0.0.1"
    assert json.loads(argv[argv.index("--kv-transfer-config") + 1])["kv_role"] == "kv_consumer"
    assert env["VLLM_CPU_OMP_THREADS_BIND"] == "1"
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "2"
    assert env["VLLM_TARGET_DEVICE"] == "cpu"
    assert env["HF_HUB_OFFLINE"] == "1"
    assert env["UCX_NET_DEVICES"] == "lo"


def test_cuda_engine_compiles_and_uses_gpu_knobs():
    s = spec(device="cuda", cores="0")
    argv, env = s.argv(), s.env({})
    assert "--enforce-eager" not in argv
    assert "--gpu-memory-utilization" in argv
    assert env["CUDA_VISIBLE_DEVICES"] == "0"
    assert "VLLM_CPU_KVCACHE_SPACE" not in env


def test_kv_events_endpoint_becomes_vllm_config():
    argv = spec(kv_events_endpoint="tcp://*:5557").argv()
    config = json.loads(argv[argv.index("--kv-events-config") + 1])
    assert config == {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": "tcp://*:5557",
    }


@pytest.mark.parametrize(
    "kwargs",
    [
        {"port": 0},
        {"kv_cache_gib": 0},
        {"block_size": 100},
        {"idle_spin_s": -1},
        {"stream_interval": 0},
    ],
)
def test_engine_spec_rejects_bad_values(kwargs):
    with pytest.raises(ValueError):
        spec(**kwargs)


def test_cpu_pd_engine_gets_the_start_up_fixes():
    s = spec(cores="0", transport=transport(progress_delay_us=2000))
    env = s.env({"PYTHONPATH": "/elsewhere"})
    assert env["PYTHONPATH"].split(":") == [str(ENGINE_SITE_DIR), "/elsewhere"]
    assert (ENGINE_SITE_DIR / "sitecustomize.py").is_file()
    assert env["PDSERVE_ENGINE_CPUS"] == "0"
    assert env["PDSERVE_KEEP_MODEL_THREAD_CORES"] == "1"
    assert env["PDSERVE_NIXL_PROGRESS_DELAY_US"] == "2000"
    assert env["PDSERVE_ENGINE_IDLE_SPIN_S"] == str(CPU_IDLE_SPIN_S)
    assert s.expected_placement() == ExpectedPlacement(cpus=frozenset({0}), model_thread_cpu=0)


def test_colocated_and_sim_engines_get_only_what_applies():
    colocated = spec(cores="0-1").env({})
    assert colocated["PDSERVE_ENGINE_CPUS"] == "0-1"
    assert "PDSERVE_KEEP_MODEL_THREAD_CORES" not in colocated
    assert "PDSERVE_NIXL_PROGRESS_DELAY_US" not in colocated
    assert "PDSERVE_NIXL_PROGRESS_DELAY_US" not in transport(progress_delay_us=0).env()
    facts = SimFacts(block_size_tokens=16, kv_capacity_tokens=1024, max_model_len=512)
    sim = spec(cores="0", engine="sim", sim_facts=facts)
    assert "PDSERVE_ENGINE_CPUS" not in sim.env({})
    assert sim.expected_placement() is None
    assert (sim.resolved_block_size(), sim.kv_capacity_tokens(), sim.context_window()) == (
        16,
        1024,
        512,
    )
    with pytest.raises(ValueError, match="sim_facts"):
        spec(engine="sim")
    assert "PDSERVE_ENGINE_IDLE_SPIN_S" not in spec(device="cuda").env({})
    assert spec(device="cuda", idle_spin_s=0.5).env({})["PDSERVE_ENGINE_IDLE_SPIN_S"] == "0.5"
    assert spec(device="cuda", cores="2").expected_placement() == ExpectedPlacement(
        cuda_visible_devices="2"
    )


def test_stream_interval_reaches_vllm_and_the_sim_by_their_flag():
    assert "--stream-interval" not in spec().argv()  # vLLM's own default: a chunk per token
    vllm_argv = spec(stream_interval=8).argv()
    assert vllm_argv[vllm_argv.index("--stream-interval") + 1] == "8"
    facts = SimFacts(block_size_tokens=16, kv_capacity_tokens=1024, max_model_len=512)
    sim_argv = spec(engine="sim", sim_facts=facts, stream_interval=8).argv()
    assert sim_argv[:4] == [sys.executable, "-m", "cli.main", "sim"]
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    assert parser.parse_args(sim_argv[4:]).stream_interval == 8


@pytest.mark.parametrize("policy", ["priority", "fcfs"])
def test_the_scheduling_policy_reaches_vllm_and_the_sim_and_priority_is_the_default(policy):
    assert spec().scheduling_policy == "priority"
    vllm_argv = spec(scheduling_policy=policy).argv()
    assert vllm_argv[vllm_argv.index("--scheduling-policy") + 1] == policy
    facts = SimFacts(block_size_tokens=16, kv_capacity_tokens=1024, max_model_len=512)
    sim_argv = spec(engine="sim", sim_facts=facts, scheduling_policy=policy).argv()
    parser = argparse.ArgumentParser()
    sim_cli.add_arguments(parser)
    assert parser.parse_args(sim_argv[4:]).scheduling_policy == policy
