#!/usr/bin/env bash
# Run by `ray job submit --working-dir deploy/ray -- bash submit.sh TASKS SHARDS`: evalsup's shards as Ray tasks
# on the job's own cluster (ray.init inside a job connects to it), merged at the end into TASKS.run/merged.jsonl.
set -euo pipefail
tasks="${1:?usage: submit.sh /shared/tasks.jsonl SHARDS}"
shards="${2:-8}"
exec evalsup run --ray --shards "$shards" \
  --base-url "${OPENAI_BASE_URL:?set OPENAI_BASE_URL on the nodes}" \
  --model "${EVALSUP_MODEL:-gpt-4o-mini}" \
  --max-requests-per-s "${EVALSUP_MAX_RPS:-50}" \
  "$tasks"
