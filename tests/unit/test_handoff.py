import pytest

from kvtransfer.handoff import ExpiredHandoff, InvalidHandoff, parse_handoff

# Captured from vLLM 0.32.0 (CPU build) answering a do_remote_decode request.
VLLM_HANDOFF = {
    "do_remote_prefill": True,
    "do_remote_decode": False,
    "remote_block_ids": [[1]],
    "remote_engine_id": "c90e2444-9b92-4449-9512-142883db650b",
    "remote_request_id": "cmpl-ab8e125bf49b2c65-0-a4a197c2",
    "remote_host": "127.0.0.1",
    "remote_port": 5601,
    "tp_size": 1,
    "dcp_size": 1,
    "pp_size": 1,
    "remote_num_tokens": 35,
    "remote_blocks_expiry_time": None,
    "transfer_mode": "pull",
}


def test_real_vllm_handoff_round_trips_verbatim():
    handoff = parse_handoff(VLLM_HANDOFF, issued_at_s=10.0)
    assert handoff.remote_engine_id == VLLM_HANDOFF["remote_engine_id"]
    assert handoff.remote_block_ids == ((1,),)
    assert handoff.to_decode_params() == VLLM_HANDOFF


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"do_remote_prefill": False}, "do_remote_prefill"),
        ({"remote_engine_id": ""}, "remote_engine_id"),
        ({"remote_engine_id": None}, "remote_engine_id"),
        ({"remote_host": None}, "remote_host"),
        ({"remote_port": 0}, "remote_port"),
        ({"remote_port": 70000}, "remote_port"),
        ({"remote_port": "5601"}, "remote_port"),
        ({"remote_port": True}, "remote_port"),
        ({"remote_block_ids": []}, "empty"),
        ({"remote_block_ids": [[]]}, "empty"),
        ({"remote_block_ids": [["x"]]}, "non-block"),
        ({"remote_block_ids": [-1]}, "non-block"),
        ({"remote_block_ids": None}, "must be a list"),
        ({"remote_request_id": 5}, "remote_request_id"),
    ],
)
def test_malformed_handoffs_are_refused(change, message):
    with pytest.raises(InvalidHandoff, match=message):
        parse_handoff({**VLLM_HANDOFF, **change}, issued_at_s=0.0)


@pytest.mark.parametrize("raw", [None, [], "handoff", 3])
def test_missing_handoff_is_refused(raw):
    with pytest.raises(InvalidHandoff):
        parse_handoff(raw, issued_at_s=0.0)


def test_lease_expiry():
    handoff = parse_handoff(VLLM_HANDOFF, issued_at_s=100.0)
    handoff.check_lease(now_s=129.9, lease_s=30.0)
    with pytest.raises(ExpiredHandoff, match=r"past its 30\.0s lease"):
        handoff.check_lease(now_s=130.1, lease_s=30.0)
