# evalsup: a batch runner for OpenAI-compatible endpoints.
#   docker build -t evalsup .          (with the math extra: --scorer math read by math-verify)
#   docker run --rm --memory 2g -v "$PWD:/data" -e OPENAI_BASE_URL -e OPENAI_API_KEY evalsup run /data/tasks.jsonl
# evalsup runs as PID 1 in exec form and handles SIGTERM itself (drain, checkpoint, exit 0); `docker run --init`
# (tini) works as well. Everything it needs comes from PyPI.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /opt/evalsup
COPY pyproject.toml README.md ./
COPY evalsup ./evalsup
RUN pip install ".[math,prices]" && useradd --create-home --uid 10001 evalsup

USER 10001:10001
WORKDIR /data
STOPSIGNAL SIGTERM
ENTRYPOINT ["evalsup"]
CMD ["--help"]
