"""The engine's dtype follows the CPU: float32 where x86 lacks native bf16, bf16 where it
has it, the model's own on GPU; a flag, then PDSERVE_DTYPE, override the rule."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from agent.engine_dtype import choose_dtype, dtype_bytes
from agent.engine_spec import EngineSpec, kv_bytes_per_token
from agent.runner import add_engine_arguments, base_spec_fields
from contracts.machine import parse_cpuinfo, read_cpu

CPUINFO = Path(__file__).resolve().parents[1] / "data" / "cpuinfo"


def cpu(name: str, arch: str = "x86_64"):
    return parse_cpuinfo((CPUINFO / f"{name}.txt").read_text(), arch=arch)


@pytest.mark.parametrize(
    ("fixture", "arch", "dtype", "native"),
    [
        ("epyc_avx2", "x86_64", "float32", False),  # issue 31's box: bf16 is emulated
        ("epyc_avx512_bf16", "x86_64", "bfloat16", True),
        ("xeon_amx", "x86_64", "bfloat16", True),  # AMX without avx512_bf16 listed
        ("graviton3", "aarch64", "bfloat16", True),
    ],
)
def test_the_cpu_dtype_is_the_one_it_computes_natively(fixture, arch, dtype, native):
    info = cpu(fixture, arch)
    assert info.native_bf16 is native
    choice = choose_dtype(device="cpu", cpu=info)
    assert choice.dtype == dtype
    assert choice.line().startswith(f"dtype {dtype}: ")
    assert ("no native bf16" in choice.reason) is not native


def test_the_flags_that_matter_are_read_with_the_model():
    info = cpu("epyc_avx2")
    assert info.model == "AMD EPYC 7B12"
    flags = info.speed_flags()
    assert flags.pop("avx2") is True and not any(flags.values()), flags
    assert cpu("xeon_amx").speed_flags()["amx_bf16"] is True


def test_a_gpu_keeps_the_models_own_dtype():
    assert choose_dtype(device="cuda", cpu=cpu("epyc_avx2")).dtype == "auto"


@pytest.mark.parametrize(
    ("requested", "setting", "dtype", "source"),
    [
        ("bfloat16", None, "bfloat16", "--dtype"),  # the flag forces bf16 on an AVX2 box
        (None, "bfloat16", "bfloat16", "PDSERVE_DTYPE"),
        ("float32", "bfloat16", "float32", "--dtype"),  # the flag beats the setting
        ("", "", "float32", None),  # empty is unset: the CPU decides
    ],
)
def test_a_flag_then_the_setting_override_the_rule(requested, setting, dtype, source):
    choice = choose_dtype(device="cpu", cpu=cpu("epyc_avx2"), requested=requested,
                          setting=setting)  # fmt: skip
    assert choice.dtype == dtype
    assert (f"set by {source}" == choice.reason) if source else "no native" in choice.reason


def test_an_unknown_dtype_is_refused_naming_the_choices():
    with pytest.raises(ValueError, match="float32"):
        choose_dtype(device="cpu", cpu=cpu("epyc_avx2"), setting="fp8")


def test_no_cpuinfo_means_no_native_bf16(tmp_path):
    info = read_cpu(tmp_path / "missing")
    assert info.flags == frozenset() and choose_dtype(device="cpu", cpu=info).dtype == "float32"


def test_the_engine_is_started_with_the_chosen_dtype_and_sizes_kv_by_it(tiny_model):
    spec = EngineSpec(model_path=str(tiny_model), served_model_name="m", port=8001,
                      dtype="float32")  # fmt: skip
    argv = spec.argv()
    assert argv[argv.index("--dtype") + 1] == "float32"
    assert "--dtype" not in EngineSpec(model_path="m", served_model_name="m", port=8001).argv()
    # The checkpoint is bf16: float32 doubles the KV bytes, so the index's capacity halves.
    checkpoint = json.loads((tiny_model / "config.json").read_text())
    assert (checkpoint.get("torch_dtype") or checkpoint.get("dtype")) == "bfloat16"
    assert kv_bytes_per_token(tiny_model, "float32") == 2 * kv_bytes_per_token(tiny_model)
    assert dtype_bytes("auto", "float32") == 4 and dtype_bytes("bfloat16", None) == 2


def test_the_agent_resolves_its_dtype_from_flag_setting_and_cpu(monkeypatch):
    parser = argparse.ArgumentParser()
    add_engine_arguments(parser)
    base = ["--model", "m", "--served-model-name", "m", "--port", "8001", "--router-url", "u",
            "--device", "cpu"]  # fmt: skip
    monkeypatch.setenv("PDSERVE_DTYPE", "float16")
    assert base_spec_fields(parser.parse_args(base))["dtype"] == "float16"
    assert base_spec_fields(parser.parse_args([*base, "--dtype", "float32"]))["dtype"] == "float32"
    monkeypatch.delenv("PDSERVE_DTYPE")
    here = choose_dtype(device="cpu", cpu=read_cpu()).dtype
    assert base_spec_fields(parser.parse_args(base))["dtype"] == here
    sim = parser.parse_args([*base, "--engine", "sim"])
    assert base_spec_fields(sim)["dtype"] == "auto"
