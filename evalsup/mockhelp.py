"""The text of ``evalsup mock --help`` past its options: live config, per-request overrides, fault modes.

Kept apart from evalsup.mock so that ``evalsup --help`` does not import the server (aiohttp).
"""

MOCK_HELP_EPILOG = """\b
Live config (while it runs):
  GET  /_mock/config           the knobs (api_key shown as ***)
  POST /_mock/config           change any of them, e.g. {"fail_429": 0.5, "retry_after_s": 2}:
                               latency_ms, jitter_ms, response_kb, fail_500, fail_429, retry_after_s, reset,
                               malformed, seed (restarts the fault sequence), models, api_key,
                               echo_headers_in_errors, revoked (true: every /v1 request gets 401),
                               revoke_after (N: 401 after N requests, counted from start or reset),
                               down (true: every connection is dropped, an outage)
  GET  /_mock/stats            counters (requests, statuses, faults, in flight, bytes)
  POST /_mock/reset            clear the counters, the mock.times attempt counts and the revoke_after count

\b
Per-request overrides: a "mock" object in the request body (a simple task line's "mock" key is sent there):
  "status": 503                answer with this HTTP status and an OpenAI-style error body (429: Retry-After)
  "in_stream": true            with a 5xx "status" on a streamed request: a 200 stream that fails midway (chat:
                               an {"error": ...} event; /v1/responses: response.failed)
  "retry_after": 2             Retry-After seconds for this 429
  "delay_s": 0.5               latency of this request (instead of --latency-ms)
  "reset": true                drop the connection with a TCP RST
  "malformed": true            200 with a body that is not valid JSON
  "cut_stream": true           send half the body (or of the SSE events), then close the connection
  "times": 2                   the faults above apply to the first 2 attempts of this exact request only
  "text": "..."                answer with this text (never padded)
  "kb": 64                     pad this answer to about 64 KB (instead of --response-kb)
  "refusal": "..."             chat: answer with this refusal (content null)

\b
Fault modes for clients' tests:
  rate-limit storm             --fail-429 0.5 --retry-after 1 (or POST /_mock/config {"fail_429": 0.5})
  revoked key                  --revoke-after N, or POST /_mock/config {"revoked": true}: 401, code
                               invalid_api_key, on every /v1 request
  outage                       POST /_mock/config {"down": true}, later {"down": false}
  a task that always fails     its line's "mock": {"status": 400} (or any status, reset, cut_stream)
  random faults                --fail-500, --fail-429, --reset, --malformed (one seeded draw per request)
"""
