import dataclasses
import json

import pytest

from sim.profile import PROFILE_DIR, load_profile


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILE_DIR.glob("*.json")))
def test_every_shipped_profile_loads_and_cites_its_source(name):
    profile = load_profile(name)
    assert profile.source and profile.num_blocks > 0
    small = profile.step_s(prefill_chunks=[(10, 0)], decode_seqs=1, decode_context_tokens=100)
    large = profile.step_s(prefill_chunks=[(1000, 0)], decode_seqs=32,
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


def test_a_measured_prefill_curve_is_followed_between_and_past_its_points():
    profile = dataclasses.replace(
        load_profile("tiny-cpu"), prefill_ms_per_token=0.1, prefill_ms_per_kpair=0.0,
        prefill_ms_per_context=0.0, prefill_ms_curve=((100, 10.0), (200, 50.0)),
    )  # fmt: skip
    assert profile.prefill_chunk_ms(50) == pytest.approx(5.0)  # from (0, 0)
    assert profile.prefill_chunk_ms(100) == pytest.approx(10.0)
    assert profile.prefill_chunk_ms(150) == pytest.approx(30.0)
    assert profile.prefill_chunk_ms(300) == pytest.approx(50.0 + 0.1 * 100)
    # Two chunks in one step cost what each costs alone, plus one floor.
    step = profile.step_s(prefill_chunks=[(100, 0), (200, 0)], decode_seqs=0,
                          decode_context_tokens=0)  # fmt: skip
    assert step * 1000 == pytest.approx(profile.floor_ms + 60.0)


def test_a_prefill_curve_that_falls_is_refused():
    with pytest.raises(ValueError, match="increase"):
        dataclasses.replace(load_profile("tiny-cpu"), prefill_ms_curve=((100, 10.0), (200, 5.0)))
