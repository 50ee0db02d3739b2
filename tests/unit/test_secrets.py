"""tasks.secrets: the one list of a run's secrets and the scrubber every writer passes its text through
(issue 39 item 4)."""

from __future__ import annotations

import base64
from pathlib import Path

import orjson

from evalsup.tasks.secrets import REDACTED, Scrubber, run_scrubber, url_secrets


def test_every_query_value_of_a_base_url_is_secret_but_the_api_version() -> None:
    url = "https://gw/openai/deployments/d?api-version=2024-02-01&sig=abc%2Fdef%3D&code=c0de-77&x=1"
    assert sorted(url_secrets(url)) == ["abc%2Fdef%3D", "c0de-77"]  # "1" is too short to protect anything
    token = base64.b64encode(b"alice:hunter22").decode()
    assert url_secrets("http://alice:hunter22@h:1/v1?api-key=SECRET123") == ["hunter22", token, "SECRET123"]


def test_a_query_value_is_scrubbed_in_each_form_an_endpoint_may_echo_it() -> None:
    s = Scrubber.for_run(["http://h/v1?sig=ab%2Fcd%2Bef99"])
    # as given, decoded, encoded again, inside a JSON string with "/" escaped
    for echoed in ("ab%2Fcd%2Bef99", "ab/cd+ef99", "ab%2Fcd%2Bef99", "ab\\/cd+ef99"):
        assert s.text(f"GET /v1?sig={echoed} 400") == f"GET /v1?sig={REDACTED} 400", echoed
    assert s.raw(b'{"u": "/v1?sig=ab%2Fcd%2Bef99"}') == b'{"u": "/v1?sig=' + REDACTED.encode() + b'"}'


def test_a_secret_is_found_by_its_anchor_in_each_form_or_always_looked_for_without_one() -> None:
    s = Scrubber.for_run(["http://h/v1?sig=ab%2Fcd%2Bef99&x=%2F%2F%2F%2F"])
    assert s.anchors == ("ef99",)  # in every form of the first; the second has none: looked for always
    assert s.text("a ab/cd+ef99 b //// c %2F%2F%2F%2F") == f"a {REDACTED} b {REDACTED} c {REDACTED}"
    assert s.raw(b"nothing here") == b"nothing here"


def test_json_values_keep_their_shape_with_the_secrets_out() -> None:
    s = Scrubber.of(['pa"ss\\word42'])
    err = {"message": 'bad key pa"ss\\word42 for you', "code": "invalid", "n": 3}
    assert s.json(err) == {"message": f"bad key {REDACTED} for you", "code": "invalid", "n": 3}
    assert s.json(None) is None and s.json({"a": "clean"}) == {"a": "clean"}
    assert orjson.loads(s.raw(orjson.dumps(err)))["message"] == f"bad key {REDACTED} for you"


def test_the_longest_secret_goes_first_and_an_empty_scrubber_changes_nothing() -> None:
    s = Scrubber.of(["abcd", "abcdefgh"])
    assert s.text("x abcdefgh y abcd") == f"x {REDACTED} y {REDACTED}"
    assert Scrubber.of([None, "", "abc"]).text("abc") == "abc" and not Scrubber()
    assert Scrubber().raw(b"anything") == b"anything"


def test_a_run_knows_its_keys_its_urls_and_its_header_secrets(tmp_path: Path) -> None:
    (tmp_path / "k").write_text("sk-from-file-123\n")
    env = {"GW_TOKEN": "gw-token-456"}
    s = Scrubber.for_run(["http://u:pw-pw-789@h/v1", "http://h2/v1?token=tok-tok-000"],
                         ["X-Gw: env:GW_TOKEN", "X-Plain: visible-value", f"X-File: @{tmp_path / 'k'}",
                          "X-Missing: env:NOT_SET_ANYWHERE"], ["sk-key-abc"], env=env)
    said = s.text("sk-key-abc pw-pw-789 tok-tok-000 gw-token-456 sk-from-file-123 visible-value")
    assert said == " ".join([REDACTED] * 5 + ["visible-value"])


def test_the_run_scrubber_reads_the_keys_the_run_uses(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    assert isinstance(monkeypatch, pytest.MonkeyPatch)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env-key-1")
    monkeypatch.setenv("JUDGE_KEY", "sk-judge-key-2")
    s = run_scrubber(["http://h/v1"], [], "OPENAI_API_KEY", None, "http://j/v1?key=judge-q-3", "JUDGE_KEY")
    assert s.text("sk-env-key-1 sk-judge-key-2 judge-q-3") == " ".join([REDACTED] * 3)
    s = run_scrubber(["http://h/v1"], [], "OPENAI_API_KEY", str(tmp_path / "gone"))  # unreadable: adds nothing
    assert s.text("sk-env-key-1") == "sk-env-key-1"


def test_a_record_says_an_error_and_a_scorers_message_without_the_secret_they_quote() -> None:
    """The worker's record (worker.records.build): an error whose text quotes the URL (an exception's, not a body,
    which the client scrubbed already) and a scorer's message, each scrubbed; the rest of the record as it was."""
    from evalsup.scoring.scorers import Scored
    from evalsup.worker.client import Outcome
    from evalsup.worker.records import build

    s = Scrubber.for_run(["http://h:1/v1?api-key=SECRET123"])
    oc = Outcome(None, None, 0, None, {"code": "connection_error", "message": "to /v1?api-key=SECRET123: reset"},
                 3, 1.5)
    scored = Scored({"judge": None}, {"judge": "judge at http://j/v1?api-key=SECRET123 said 404"}, [])
    parts, meta = build("t1", oc, 7, 0.0, 1, {"index": 0, "url": "http://h:1/v1"}, {"k": "v"}, scored, scrub=s)
    rec = orjson.loads(b"".join(parts))
    assert rec["error"]["message"] == f"to /v1?api-key={REDACTED}: reset"
    assert rec["score_errors"] == {"judge": f"judge at http://j/v1?api-key={REDACTED} said 404"}
    assert rec["metadata"] == {"k": "v"} and meta["ec"] == "connection_error"
    assert b"SECRET123" not in b"".join(parts)


def test_events_jsonl_says_a_reason_without_the_secret_it_quotes(tmp_path: Path) -> None:
    from evalsup.supervisor.events import EventLog

    log = EventLog(tmp_path / "events.jsonl", Scrubber.for_run(["http://h:1/v1?sig=SECRET123"]))
    log("breaker_open", endpoint=0, reason="HTTP 500: upstream /v1?sig=SECRET123 failed")
    log.close()
    event = orjson.loads((tmp_path / "events.jsonl").read_bytes())
    assert event["event"] == "breaker_open" and event["reason"] == f"HTTP 500: upstream /v1?sig={REDACTED} failed"


def test_the_python_api_hands_a_url_with_a_credential_to_its_child_in_the_environment() -> None:
    from evalsup.api.options import credentials_off_the_command_line

    for url in ("http://h/v1?api-key=SECRET123", "http://a:pw-12345@h/v1"):
        opts, env = credentials_off_the_command_line({"base_url": [url, "http://g/v1"], "model": "m"})
        assert opts == {"base_url": None, "model": "m"} and env == {"OPENAI_BASE_URL": f"{url},http://g/v1"}
    plain = {"base_url": ["http://h/v1?api-version=2024-02-01"]}
    assert credentials_off_the_command_line(plain) == (plain, {})


def test_a_batch_answer_that_echoes_a_secret_is_recorded_without_it() -> None:
    """--batch-api (issue 39 item 4): the driver's records pass the same scrub list as a worker's."""
    from evalsup.batch.records import Answer, build
    from evalsup.tasks.secrets import Scrubber

    secret = "BATCH-SECRET-42"
    scrub = Scrubber.for_run([f"http://127.0.0.1:1/v1?sig={secret}"], (), [])
    a = Answer("t1", 400, {"error": {"message": f"bad request to /v1?sig={secret}", "code": "invalid"}}, "r1",
               "batch_req_1", "invalid", f"refused: ?sig={secret}")
    [line], _meta = build(a, 0, 1, 1, {"index": 0, "url": "http://127.0.0.1:1/v1"}, {"id": "b1"}, {}, None, 0.0,
                          scrub)
    assert secret.encode() not in line and b"[redacted]" in line
