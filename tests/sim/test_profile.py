import json

import pytest

from sim.profile import PROFILE_DIR, load_profile


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
def test_every_shipped_profile_loads_and_cites_its_source(name):
    profile = load_profile(name)
    assert profile.source and profile.num_blocks > 0
    small = profile.step_s(prefill_tokens=10, prefill_context_tokens=0, decode_seqs=1,
                           decode_context_tokens=100)  # fmt: skip
    large = profile.step_s(prefill_tokens=1000, prefill_context_tokens=0, decode_seqs=32,
                           decode_context_tokens=10_000)  # fmt: skip
    assert 0 < small < large
    assert profile.transfer_s(1000) > profile.transfer_s(10) > 0


def test_unknown_profile_and_unknown_keys_are_refused(tmp_path):
    with pytest.raises(ValueError, match="known"):
        load_profile("no-such-profile")
    raw = json.loads((PROFILE_DIR / "tiny-cpu.json").read_text())
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({**raw, "decode_ms_per_sequence": 1}))
    with pytest.raises(ValueError, match="unknown keys"):
        load_profile(str(bad))
