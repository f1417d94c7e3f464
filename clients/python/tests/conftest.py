"""Test fixtures: the real aaa server binary on a free port, and clients connected to it.

The binary is env AAA_BIN, by default target/debug/aaa of this repository
(run `cargo build` first). One server with a temporary data dir serves the
whole session; it is stopped with SIGTERM (then SIGKILL) at the end.
"""

from __future__ import annotations

import os
import queue
import re
import signal
import subprocess
import threading
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

import aaa

REPO = Path(__file__).resolve().parents[3]
SERVING_RE = re.compile(r"serving on (\S+:\d+)")
START_TIMEOUT_S = 30


@dataclass
class Server:
    """A running aaa server process."""

    address: str
    process: subprocess.Popen
    data_dir: Path
    log_path: Path

    def log_tail(self, lines: int = 30) -> str:
        """The last lines of the server's stderr."""
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def binary_path() -> Path:
    """The server binary under test."""
    return Path(os.environ.get("AAA_BIN") or REPO / "target" / "debug" / "aaa")


def stop_process(process: subprocess.Popen, timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL if it does not exit in time."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def store_args(data_dir: Path) -> list[str]:
    """``--store URL`` when the suite runs on PostgreSQL (AAA_TEST_STORE=postgres): a fresh schema of
    AAA_TEST_POSTGRES per data dir, remembered beside it so a restart finds the same data."""
    if os.environ.get("AAA_TEST_STORE") != "postgres":
        return []
    remembered = data_dir.parent / f"{data_dir.name}.store-url"
    if not remembered.exists():
        base = os.environ["AAA_TEST_POSTGRES"]
        separator = "&" if "?" in base else "?"
        remembered.write_text(f"{base}{separator}options=-csearch_path%3Daaa_test_{uuid.uuid4().hex}")
    return [f"--store={remembered.read_text()}"]


def start_server(data_dir: Path, log_path: Path, listen: str = "127.0.0.1:0", extra_args: tuple[str, ...] = ()) -> Server:
    """Start the binary (with ``extra_args`` after its flags) and wait for its "serving on HOST:PORT" line."""
    binary = binary_path()
    if not binary.exists():
        pytest.fail(
            f"aaa server binary not found at {binary}: run `cargo build` in {REPO} first (or set AAA_BIN)",
            pytrace=False,
        )
    log = open(log_path, "ab")
    process = subprocess.Popen(
        [str(binary), "serve", "--listen", listen, "--data-dir", str(data_dir), *store_args(data_dir), *extra_args],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
    )
    log.close()
    lines: queue.Queue[str | None] = queue.Queue()

    def pump() -> None:  # read stdout for the address, then keep the pipe drained
        for line in process.stdout:
            lines.put(line)
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    server = Server("", process, data_dir, log_path)
    while True:
        try:
            line = lines.get(timeout=START_TIMEOUT_S)
        except queue.Empty:
            stop_process(process)
            pytest.fail(f"the server printed no 'serving on' line in {START_TIMEOUT_S}s\n{server.log_tail()}")
        if line is None:
            stop_process(process)
            pytest.fail(f"the server exited with {process.wait()} before serving\n{server.log_tail()}")
        match = SERVING_RE.search(line)
        if match:
            server.address = match.group(1)
            return server


@pytest.fixture(scope="session")
def server(tmp_path_factory: pytest.TempPathFactory):
    """One aaa server for the session, on a free port with a temporary data dir."""
    root = tmp_path_factory.mktemp("aaa")
    srv = start_server(root / "data", root / "server.log")
    yield srv
    stop_process(srv.process)


@pytest.fixture
async def client(server: Server):
    """A client connected to the session's server."""
    c = await aaa.connect(server.address)
    yield c
    await c.close()


@pytest.fixture
def uid() -> str:
    """A short unique suffix for the tool, model and label names of one test."""
    return uuid.uuid4().hex[:10]
