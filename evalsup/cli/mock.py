"""`evalsup mock`: the command, and the text of its --help past the options (live config, per-request overrides,
fault modes). Imports the server (aiohttp) only when the command runs, so `evalsup --help` stays light."""

from __future__ import annotations

import os
import sys

import click

MOCK_HELP_EPILOG = """\b
Live config (while it runs):
  GET  /_mock/config           the knobs (api_key shown as ***)
  POST /_mock/config           change any of them, e.g. {"fail_429": 0.5, "retry_after_s": 2}:
                               latency_ms, jitter_ms, response_kb, fail_500, fail_429, retry_after_s, reset,
                               malformed, cut_stream, slow, slow_ms, fast_refusals,
                               seed (restarts the fault sequence), models,
                               api_key, echo_headers_in_errors, revoked (true: every /v1 request gets 401),
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
  "invalid_first": 1           answer invalid JSON until the conversation holds 1 assistant turn (one re-ask of
                               --response-schema), then "text"

\b
Fault modes for clients' tests:
  rate-limit storm             --fail-429 0.5 --retry-after 1 (or POST /_mock/config {"fail_429": 0.5})
  a gateway's ways             --basic-auth-env NAME (user:password), --require-query api-version=V, and
                               --api-key-header api-key: Azure OpenAI (POST /openai/deployments/NAME/...)
  revoked key                  --revoke-after N, or POST /_mock/config {"revoked": true}: 401, code
                               invalid_api_key, on every /v1 request
  outage                       POST /_mock/config {"down": true}, later {"down": false}
  a task that always fails     its line's "mock": {"status": 400} (or any status, reset, cut_stream)
  a stuck slot now and then    --slow 0.05 --slow-ms 30000: exactly 5 % of requests (evenly spaced) answered
                               after 30 s, or never if the client goes first (tail hedging, stalls)
  a gateway's refusals         --fast-refusals: the random 429s and 500s come back at once, before the latency
  random faults                --fail-500, --fail-429, --reset, --malformed, --cut-stream (one seeded draw per
                               request)
"""


_FRACTION = click.FloatRange(0.0, 1.0)


@click.command("mock", epilog=MOCK_HELP_EPILOG)
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=click.IntRange(0, 65535), default=8000, show_default=True,
              help="Port to listen on (0: any free one).")
@click.option("--model", "models", multiple=True, metavar="NAME",
              help="A model name to serve (repeatable; default mock-model). Other names get 404 model_not_found.")
@click.option("--latency-ms", type=float, default=0.0, show_default=True, help="Mean latency per response.")
@click.option("--jitter-ms", type=float, default=0.0, show_default=True, help="Uniform +- jitter.")
@click.option("--response-kb", type=float, default=0.0, show_default=True,
              help="Pad chat and completions text answers so the JSON body is about this size.")
@click.option("--fail-500", type=_FRACTION, default=0.0, show_default=True, help="Fraction answered 500.")
@click.option("--fail-429", type=_FRACTION, default=0.0, show_default=True,
              help="Fraction answered 429 with Retry-After (a rate-limit storm at 0.3-1.0).")
@click.option("--retry-after", type=float, default=1.0, show_default=True, help="Retry-After seconds on 429.")
@click.option("--reset", type=_FRACTION, default=0.0, show_default=True,
              help="Fraction of connections reset (TCP RST, no response).")
@click.option("--malformed", type=_FRACTION, default=0.0, show_default=True,
              help="Fraction answered 200 with a body that is not valid JSON (or a broken SSE event).")
@click.option("--cut-stream", type=_FRACTION, default=0.0, show_default=True,
              help="Fraction of answers cut midway: half the body (or of the SSE events), then the connection closed.")
@click.option("--slow", type=_FRACTION, default=0.0, show_default=True,
              help="Fraction of requests answered after --slow-ms instead (exactly that share, evenly spaced): a "
                   "replica with a stuck slot now and then.")
@click.option("--slow-ms", type=float, default=5000.0, show_default=True, help="Latency of the --slow requests.")
@click.option("--fast-refusals", is_flag=True, default=False,
              help="Answer the random 429s and 500s at once, before --latency-ms, as a gateway's rate limiter "
                   "or proxy does (llmock does so): a refusal then comes back long before an answer.")
@click.option("--api-key-env", metavar="NAME", default=None,
              help="Require \"Authorization: Bearer $NAME\" (the key is read from that variable, never printed).")
@click.option("--api-key-header", metavar="NAME", default=None,
              help="With --api-key-env: require the key in this header instead (Azure OpenAI: api-key).")
@click.option("--basic-auth-env", metavar="NAME", default=None,
              help="Require HTTP basic auth with the user:password in this variable (never printed), as a gateway.")
@click.option("--require-query", metavar="NAME=VALUE[&...]", default=None,
              help="Answer 404 to a request without these query parameters (Azure OpenAI: api-version=...).")
@click.option("--revoke-after", type=click.IntRange(0), default=None, metavar="N",
              help="Answer every /v1 request after the first N with 401 invalid_api_key (a key revoked mid-run).")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed of the answers and of the fault draws.")
@click.option("--capacity", type=click.IntRange(0, None), default=0, show_default=True,
              help="Serve at most this many requests at once (0: no limit), as an engine's batch; GET /metrics shows "
                   "vLLM-style running and waiting gauges.")
@click.option("--queue", type=click.IntRange(0, None), default=0, show_default=True,
              help="With --capacity: this many more wait in a FIFO; beyond them, 429 with Retry-After.")
@click.option("--judge", is_flag=True,
              help="Act as a judge for --scorer judge: a request from the default judge template is answered "
                   "GRADE: C when its <answer> equals its <reference>, else GRADE: I.")
def mock_command(host: str, port: int, models: tuple[str, ...], latency_ms: float, jitter_ms: float, response_kb: float,
         fail_500: float, fail_429: float, retry_after: float, reset: float, malformed: float,
         cut_stream: float, slow: float, slow_ms: float, fast_refusals: bool,
         api_key_env: str | None, api_key_header: str | None,
         basic_auth_env: str | None,
         require_query: str | None, revoke_after: int | None, seed: int, capacity: int, queue: int,
         judge: bool = False) -> None:
    """Serve an OpenAI-compatible mock endpoint with fault injection (for tests and benchmarks).

    \b
    POST /v1/chat/completions, /v1/completions, /v1/embeddings, /v1/responses (streamed with "stream": true),
    GET /v1/models[/NAME]. Chat answers a tool call when the request has "tools", logprobs when asked,
    n > 1 choices, and a usage chunk with stream_options.include_usage.
    """
    from evalsup.mock.server import MockConfig, serve_forever

    key = None
    if api_key_env is not None:
        key = os.environ.get(api_key_env)
        if not key:
            click.echo(f"evalsup: --api-key-env {api_key_env}: the variable is not set or empty", err=True)
            sys.exit(2)
    basic = None
    if basic_auth_env is not None:
        basic = os.environ.get(basic_auth_env)
        if not basic or ":" not in basic:
            click.echo(f"evalsup: --basic-auth-env {basic_auth_env}: the variable is not set to user:password",
                       err=True)
            sys.exit(2)
    cfg = MockConfig(basic_auth=basic, api_key_header=api_key_header, require_query=require_query,
                     latency_ms=latency_ms, jitter_ms=jitter_ms, response_kb=response_kb, fail_500=fail_500,
                     fail_429=fail_429, retry_after_s=retry_after, reset=reset, malformed=malformed,
                     cut_stream=cut_stream, slow=slow, slow_ms=slow_ms, fast_refusals=fast_refusals,
                     seed=seed,
                     models=models or ("mock-model",), api_key=key, revoke_after=revoke_after, capacity=capacity,
                     queue=queue, judge=judge)
    serve_forever(cfg, host, port)
