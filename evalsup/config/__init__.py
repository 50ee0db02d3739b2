"""A run's settings: every option defined once, RunConfig, rate limits, shards, the container's memory, exit codes."""
