"""Issue 21: the server-metrics parser (the queue gauges of vLLM, SGLang and TGI, a server without them) and
where the metrics are looked for. (The mock's capacity model and the scraper over HTTP:
integration/test_server_signals.py.)"""

from __future__ import annotations

from evalsup.worker.server_signals import ServerQueue, metrics_url, parse_queue

VLLM = """\
# HELP vllm:num_requests_running Number of requests currently running on GPU.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 12.0
vllm:num_requests_running{engine="1",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 10.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 3.0
vllm:num_requests_waiting{engine="1",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 4.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 0.4
# HELP vllm:e2e_request_latency_seconds Histogram of e2e request latency in seconds.
# TYPE vllm:e2e_request_latency_seconds histogram
vllm:e2e_request_latency_seconds_bucket{le="0.3",model_name="Qwen/Qwen2.5-0.5B-Instruct"} 2.0
vllm:num_requests_waiting_by_reason{reason="capacity",model_name="x"} 99.0
"""

SGLANG = """\
# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct",name="x,y}"} 48.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="meta-llama/Llama-3.1-8B-Instruct"} 17.0
sglang:token_usage{model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.83
"""

TGI = """\
# TYPE tgi_queue_size gauge
tgi_queue_size 5
# TYPE tgi_batch_current_size gauge
tgi_batch_current_size 32
tgi_request_count 1234 1700000000000
"""


def test_parses_the_queue_gauges_of_vllm_sglang_and_tgi() -> None:
    assert parse_queue(VLLM) == ServerQueue(waiting=7.0, running=22.0, kv_cache=0.4)  # summed over engines
    assert parse_queue(SGLANG) == ServerQueue(waiting=17.0, running=48.0)
    assert parse_queue(TGI) == ServerQueue(waiting=5.0, running=32.0)


def test_a_server_without_queue_gauges_gives_nothing() -> None:
    assert parse_queue("# TYPE process_cpu_seconds_total counter\nprocess_cpu_seconds_total 3.5\n") is None
    assert parse_queue("<html>not found</html>") is None
    assert parse_queue("vllm:num_requests_waiting{broken 3\nvllm:num_requests_waiting NaN\n") is None


def test_metrics_are_looked_for_at_the_server_root() -> None:
    assert metrics_url("http://10.0.0.5:8000/v1", None) == "http://10.0.0.5:8000/metrics"
    assert metrics_url("https://gw.example/openai/v1", None) == "https://gw.example/metrics"
    assert metrics_url("http://h:8000/v1", "http://h:9100/metrics") == "http://h:9100/metrics"
    assert metrics_url("http://h:8000/v1", "off") is None
