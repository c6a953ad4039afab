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


NIXL_METRICS = """\
vllm:nixl_xfer_time_seconds_bucket{engine="0",le="0.005",model_name="m"} 1.0
vllm:nixl_xfer_time_seconds_count{engine="0",model_name="m"} 4.0
vllm:nixl_xfer_time_seconds_sum{engine="0",model_name="m"} 0.2
vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 4.0
vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 1048576.0
vllm:nixl_num_failed_transfers_total{engine="0",model_name="m"} 1.0
vllm:external_prefix_cache_queries_total{engine="0",model_name="m"} 96.0
vllm:external_prefix_cache_hits_total{engine="0",model_name="m"} 64.0
"""


def test_parse_load_reads_vllm_nixl_transfers_and_external_prefix_hits():
    load = parse_load(NIXL_METRICS)
    assert (load.kv_transfers, load.kv_transfer_seconds) == (4.0, 0.2)
    assert load.kv_transfer_bytes == 1048576.0  # the histogram's sum, not its count
    assert load.kv_transfer_failures == 1.0
    assert (load.external_prefix_cache_queries, load.external_prefix_cache_hits) == (96.0, 64.0)
