"""Which dtype the engine computes in: the one the hardware computes natively.

vLLM's ``--dtype auto`` keeps the checkpoint's dtype. The models pdserve prepares are
saved in bf16, and on an x86 CPU without AVX-512 BF16 or AMX, bf16 is emulated: a
2-core AVX2 EPYC prefilled 5x slower in bf16 than in float32 (shared notes, 12-05).
So on CPU the agent asks for float32 unless the CPU has native bf16; on GPU it leaves
the model's own dtype. An explicit ``--dtype`` or ``PDSERVE_DTYPE`` overrides the rule.

Pure: the CPU's flags come in as a ``CpuInfo``, so tests choose from fixtures.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from contracts.machine import CpuInfo

# vLLM's --dtype values pdserve passes on; "auto" is the checkpoint's own.
DTYPES = ("auto", "float32", "bfloat16", "float16")
Dtype = Literal["auto", "float32", "bfloat16", "float16"]
# The environment setting that overrides the choice (an agent flag overrides both).
DTYPE_ENV = "PDSERVE_DTYPE"


@dataclass(frozen=True, slots=True)
class DtypeChoice:
    dtype: Dtype
    reason: str

    def line(self) -> str:
        """The one line ``pdserve up`` prints."""
        return f"dtype {self.dtype}: {self.reason}"


def choose_dtype(
    *, device: str, cpu: CpuInfo, requested: str | None = None, setting: str | None = None
) -> DtypeChoice:
    """``requested`` (the flag) wins, then ``setting`` (``PDSERVE_DTYPE``); either may be
    None or "" for unset. Otherwise: the model's own on GPU, bf16 on a CPU that computes
    it natively, float32 on one that does not."""
    for value, source in ((requested, "--dtype"), (setting, DTYPE_ENV)):
        if value:
            if value not in DTYPES:
                raise ValueError(f"{source}={value!r}: choose one of {', '.join(DTYPES)}")
            return DtypeChoice(value, f"set by {source}")  # type: ignore[arg-type]
    if device != "cpu":
        return DtypeChoice("auto", f"the model's own dtype on {device}")
    if cpu.native_bf16:
        native = sorted(cpu.flags & {"avx512_bf16", "amx_bf16", "bf16"})
        return DtypeChoice("bfloat16", f"the CPU computes bf16 natively ({', '.join(native)})")
    return DtypeChoice(
        "float32",
        f"the CPU has no native bf16 (no avx512_bf16 or amx_bf16 on {cpu.model}); "
        "bf16 would be emulated, ~5x slower",
    )


def dtype_bytes(dtype: str, checkpoint_dtype: str | None) -> int:
    """Bytes per element of the KV cache vLLM allocates (``kv_cache_dtype`` auto follows
    the model dtype): 2 for 16-bit dtypes, 4 for float32. ``auto`` is the checkpoint's."""
    resolved = checkpoint_dtype if dtype == "auto" else dtype
    return 4 if resolved in ("float32", "float") else 2
