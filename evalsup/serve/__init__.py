"""`evalsup serve` (issue 42): OpenAI's Files and Batches API in front of any OpenAI-compatible endpoint, each
batch an evalsup run in a child process (`python -m evalsup run`), so it resumes exactly once after any crash.
See docs/serve.md."""
