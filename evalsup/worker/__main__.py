"""Entry point of a worker process: ``python -m evalsup.worker`` (frames on stdin/stdout)."""

from evalsup.worker.main import main

main()
