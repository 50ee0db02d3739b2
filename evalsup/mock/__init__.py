"""evalsup's own OpenAI-compatible mock endpoint with fault injection (see evalsup.mock.server)."""

from evalsup.mock.config import MockConfig
from evalsup.mock.server import MockServer, MockThread, create_app, serve_forever, start_mock
from evalsup.mock.stats import MockStats

__all__ = ["MockConfig", "MockServer", "MockStats", "MockThread", "create_app", "serve_forever", "start_mock"]
