"""`evalsup serve`'s process: the state read back (what a crash left half done removed), every batch not ended
resumed, the HTTP server started, the retention sweep every minute; SIGTERM or SIGINT drains (no new upload or
batch, every run checkpointed and stopped: their batches resume at the next start) and exits 0."""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from evalsup.config.exitcodes import BAD_INPUT, FAILED, LOCKED, OK
from evalsup.rundir.lock import RunDirBusy, RunDirError, RunDirLock
from evalsup.serve.app import Api, Limits
from evalsup.serve.runner import Batches, Settings
from evalsup.serve.store import Store

log = logging.getLogger("evalsup.serve")
SWEEP_S = 60.0


@dataclass(frozen=True)
class ServeConfig:
    host: str
    port: int
    data: Path
    settings: Settings
    limits: Limits
    owners: frozenset[str] | None  # None: no --api-keys (loopback only)


def is_loopback(host: str) -> bool:
    """Every address ``host`` names is a loopback one (127.0.0.0/8, ::1, localhost)."""
    try:
        infos = socket.getaddrinfo(host, None)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0]).is_loopback for i in infos)


class ServeError(Exception):
    """The server cannot start: one line, and the exit code (exitcodes)."""

    def __init__(self, message: str, code: int) -> None:
        super().__init__(message)
        self.code = code


def serve_forever(cfg: ServeConfig) -> int:
    """Serve until SIGTERM or SIGINT; the exit code (0 after a drain). Raises ServeError when it cannot start."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="evalsup serve: %(message)s")
    lock = RunDirLock(cfg.data)  # one server per DIR (the kernel drops the flock however the holder dies)
    try:
        lock.acquire(command="serve")
    except RunDirBusy as e:
        raise ServeError(str(e), LOCKED) from None
    except RunDirError as e:
        raise ServeError(str(e), BAD_INPUT) from None
    try:
        asyncio.run(_serve(cfg))
    finally:
        lock.release()
    return OK


async def _serve(cfg: ServeConfig) -> None:
    store = Store(cfg.data)
    try:
        removed = store.load()
    except (OSError, ValueError, KeyError) as e:
        raise ServeError(f"--data {cfg.data}: its state cannot be read ({e}); nothing was changed", FAILED) from None
    for p in removed:
        log.info("removed what a crash left half done: %s", p)
    batches = Batches(store, cfg.settings)
    runner = web.AppRunner(Api(batches, cfg.owners, cfg.limits).app(), access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, cfg.host, cfg.port)
    try:
        await site.start()
    except OSError as e:
        await runner.cleanup()
        raise ServeError(f"cannot listen on {cfg.host}:{cfg.port}: {e.strerror or e}", BAD_INPUT) from None
    port = runner.addresses[0][1] if runner.addresses else cfg.port
    log.info("listening on http://%s:%s/v1 (data %s, upstreams %s, %s)", cfg.host, port, cfg.data,
             len(cfg.settings.upstreams), "keys required" if cfg.owners is not None else "no keys: loopback only")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    batches.resume()
    sweeper = loop.create_task(_sweep(batches, min(SWEEP_S, max(1.0, cfg.settings.retention_s / 4))))
    await stop.wait()
    log.info("stopping: every run checkpoints; their batches resume at the next start")
    sweeper.cancel()
    await batches.drain()
    await runner.cleanup()
    log.info("stopped")


async def _sweep(batches: Batches, every: float) -> None:
    """Retention, every minute (more often under a short --retention-hours)."""
    while True:
        with contextlib.suppress(OSError):
            batches.sweep()
        await asyncio.sleep(every)
