"""Several sidecar processes: the model for using every core.

One Python process is bound by its interpreter lock, so with ``workers = N``
the sidecar runs N worker processes, each a complete sidecar serving its own
address (:func:`worker_addresses`); Envoy's sidecar cluster lists all of them
and sends each new stream to the least busy one. Workers are spawned, never
forked (gRPC does not survive a fork). Metrics are aggregated across workers
with prometheus-client's multiprocess mode and served by the parent. Each
worker keeps its own cache, change listener and audit chain
(:func:`worker_audit_log`), so ``audit verify`` checks one file per worker.

A worker that dies stops the whole pool: the parent exits non-zero and the
process supervisor (Kubernetes, systemd, ``proxy``) restarts it, rather than
the pool running on with a share of Envoy's streams failing.
"""

from __future__ import annotations

import asyncio
import ctypes
import logging
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from dataclasses import replace
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from prometheus_client.multiprocess import MultiProcessCollector

from sidecar.config import Settings
from sidecar.runtime import event_loop
from sidecar.runtime.addresses import HostPort, UnixSocket, parse_socket_address
from sidecar.runtime.server import STOP_GRACE_SECONDS, serve_metrics, serve_until_signalled
from sidecar.runtime.signals import StopSignals
from sidecar.runtime.tracing import check_environment as check_tracing_environment

log = logging.getLogger(__name__)

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_START_SECONDS = 30.0
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def worker_addresses(grpc_listen: str, workers: int) -> list[str]:
    """The address of each worker: ``unix:/p`` -> ``unix:/p.0`` ...; ``host:port`` -> port + i.

    One worker keeps the address as configured.
    """
    if workers == 1:
        return [grpc_listen]
    address = parse_socket_address(grpc_listen)
    if isinstance(address, UnixSocket):
        return [f"{address}.{i}" for i in range(workers)]
    return [str(HostPort(address.host, address.port + i)) for i in range(workers)]


def worker_audit_log(audit_log: Path, index: int, workers: int) -> Path:
    """Worker ``index``'s audit file: ``decisions.jsonl`` -> ``decisions.2.jsonl``."""
    if workers == 1:
        return audit_log
    return audit_log.with_name(f"{audit_log.stem}.{index}{audit_log.suffix}")


def worker_settings(settings: Settings, index: int) -> Settings:
    """The settings worker ``index`` runs with: its own addresses and audit chain, no /metrics."""
    workers = settings.listen.workers
    audit = settings.audit
    return replace(
        settings,
        listen=replace(
            settings.listen,
            workers=1,
            grpc=worker_addresses(settings.listen.grpc, workers)[index],
            gate=(
                None
                if settings.listen.gate is None
                else worker_addresses(settings.listen.gate, workers)[index]
            ),
        ),
        audit=replace(
            audit,
            log=None if audit.log is None else worker_audit_log(audit.log, index, workers),
            chain_id=None if audit.chain_id is None else f"{audit.chain_id}.{index}",
        ),
        telemetry=replace(settings.telemetry, metrics=None),
    )


def _exit_with_parent(parent: int) -> None:
    """Have the kernel SIGTERM this worker when the parent dies, even by SIGKILL (Linux)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):
        log.warning("cannot tie worker %d to its parent; stop workers with the parent", os.getpid())
    if os.getppid() != parent:
        # The parent died before the request took effect.
        os.kill(os.getpid(), signal.SIGTERM)


def _run_worker(settings: Settings, parent: int) -> None:
    _exit_with_parent(parent)
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s worker[{os.getpid()}] %(levelname)s %(message)s"
    )
    event_loop.run(serve_until_signalled(settings), settings.listen.event_loop)


def _accepts(address: str) -> bool:
    parsed = parse_socket_address(address)
    target: str | tuple[str, int]
    if isinstance(parsed, UnixSocket):
        family, target = socket.AF_UNIX, parsed.path
    else:
        family, target = parsed.family, (parsed.host, parsed.port)
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.settimeout(0.5)
        try:
            probe.connect(target)
        except OSError:
            return False
    return True


class WorkerPool:
    """N sidecar worker processes and the aggregated /metrics endpoint."""

    def __init__(self, settings: Settings) -> None:
        if settings.listen.workers < 2:
            raise ValueError("a worker pool needs workers >= 2")
        self.settings = settings
        self._processes: list[BaseProcess] = []
        self._metrics_dir: tempfile.TemporaryDirectory[str] | None = None
        self._metrics_server: Any = None

    async def start(self) -> None:
        """Spawn the workers and return once every one accepts connections (30 s at most).

        Each worker starts its own tracer provider; the OTEL_* variables are
        checked here first, so that a wrong one is a ConfigError, not a dead worker.
        """
        check_tracing_environment()
        self._metrics_dir = tempfile.TemporaryDirectory(prefix="retrieval-gate-metrics-")
        # Workers read it when they import prometheus_client; spawn passes the environment.
        os.environ[MULTIPROC_ENV] = self._metrics_dir.name
        context = multiprocessing.get_context("spawn")
        for index in range(self.settings.listen.workers):
            process: BaseProcess = context.Process(
                target=_run_worker,
                args=(worker_settings(self.settings, index), os.getpid()),
                name=f"retrieval-gate-worker-{index}",
            )
            process.start()
            self._processes.append(process)
        addresses = worker_addresses(self.settings.listen.grpc, self.settings.listen.workers)
        deadline = time.monotonic() + _START_SECONDS
        for process, address in zip(self._processes, addresses, strict=True):
            while not await asyncio.to_thread(_accepts, address):
                if not process.is_alive():
                    raise RuntimeError(f"worker {process.name} exited with {process.exitcode}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"worker {process.name} did not listen on {address}")
                await asyncio.sleep(0.05)
        log.info("%d workers listening on %s", len(addresses), ", ".join(addresses))
        if self.settings.telemetry.metrics:
            registry = CollectorRegistry()
            MultiProcessCollector(registry, path=self._metrics_dir.name)  # type: ignore[no-untyped-call]
            self._metrics_server = serve_metrics(self.settings.telemetry.metrics, registry)
            log.info("metrics (all workers) on http://%s/metrics", self.settings.telemetry.metrics)

    @property
    def pids(self) -> list[int]:
        """The workers' process ids."""
        return [p.pid for p in self._processes if p.pid is not None]

    async def wait(self) -> int:
        """Return the exit code of the first worker that exits."""
        while True:
            for process in self._processes:
                if not process.is_alive():
                    return process.exitcode if process.exitcode is not None else 1
            await asyncio.sleep(0.2)

    async def stop(self, grace: float = STOP_GRACE_SECONDS + 5.0) -> None:
        """SIGTERM every worker, wait ``grace`` seconds, then kill what is left.

        Each worker gives its streams in flight STOP_GRACE_SECONDS and exits as
        soon as they are done."""
        for process in self._processes:
            if process.is_alive():
                process.terminate()
        deadline = time.monotonic() + grace
        for process in self._processes:
            await asyncio.to_thread(process.join, max(0.0, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                await asyncio.to_thread(process.join)
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
        if self._metrics_dir is not None:
            os.environ.pop(MULTIPROC_ENV, None)
            self._metrics_dir.cleanup()


async def serve_workers_until_signalled(settings: Settings) -> int:
    """Run a worker pool until SIGINT or SIGTERM (0), or until a worker exits (1).

    A worker that dies stops the whole pool (see the module docstring).
    """
    pool = WorkerPool(settings)
    with StopSignals() as signals:
        try:
            await pool.start()
            return await signals.wait({"a worker": pool.wait()})
        finally:
            await pool.stop()
