"""evalsup: a memory-safe, crash-safe batch runner for OpenAI-compatible endpoints."""

__version__ = "0.1.0"
