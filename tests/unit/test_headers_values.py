"""Issue 21: --header values (from the line, the environment or a file for secrets), a bad header naming
itself, and the User-Agent. (Headers on the wire: integration/test_headers.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest

from evalsup import __version__
from evalsup.tasks.headers import HeaderError, build_headers, resolve, secret_values, user_agent


def test_values_come_from_the_line_the_environment_or_a_file(tmp_path: Path) -> None:
    f = tmp_path / "key"
    f.write_text("file-secret-value\n")
    env = {"GW_KEY": "env-secret-value"}
    assert resolve("X-Route: eu-west", env) == ("X-Route", "eu-west")
    assert resolve("api-key: env:GW_KEY", env) == ("api-key", "env-secret-value")
    assert resolve(f"X-Token: @{f}", env) == ("X-Token", "file-secret-value")
    h = build_headers(["X-Route: a", "x-route: b"], env)
    assert h == {"User-Agent": user_agent(), "x-route": "b"}  # the last of one name wins, whatever its case
    assert secret_values(["X-Route: eu-west", "api-key: env:GW_KEY", f"X-Token: @{f}"], env) == [
        "env-secret-value", "file-secret-value"]


@pytest.mark.parametrize("spec, says", [
    ("no-colon-here", "expected 'Name: value'"),
    ("Bad Name: x", "expected 'Name: value'"),
    ("Content-Type: text/plain", "evalsup sets this header itself"),
    ("api-key: env:NOT_SET_ANYWHERE_21", "NOT_SET_ANYWHERE_21 is not set"),
    ("api-key: @/nonexistent/key/file", "cannot read /nonexistent/key/file"),
])
def test_a_bad_header_names_itself_and_the_cause(spec: str, says: str) -> None:
    with pytest.raises(HeaderError, match=says.replace("(", r"\(")):
        resolve(spec, {})


def test_user_agent_names_evalsup_and_its_version() -> None:
    assert user_agent() == f"evalsup/{__version__}"
