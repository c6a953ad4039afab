from agent.engine_load import parse_load

VLLM_METRICS = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="tiny-llama"} 3.0
vllm:num_requests_waiting{engine="0",model_name="tiny-llama"} 7.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="tiny-llama",reason="capacity"} 9.0
vllm:kv_cache_usage_perc{engine="0",model_name="tiny-llama"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="tiny-llama"} 0.5
"""


def test_parse_load_sums_requests_and_takes_the_fullest_ranks_kv_usage():
    load = parse_load(VLLM_METRICS)
    assert load.num_requests_running == 3.0
    assert load.num_requests_waiting == 7.0
    assert load.kv_cache_usage_perc == 0.5  # a fraction: a sum over ranks could pass 1
    assert load.known


def test_parse_load_of_garbage_is_zero():
    assert parse_load("vllm:num_requests_running{broken\nnot metrics").num_requests_running == 0
