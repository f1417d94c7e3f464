"""Helpers shared by the tests: strict JSON comparison, event collection, a closed port, a droppable TCP proxy,
a test CA with its certificates."""

from __future__ import annotations

import asyncio
import hashlib
import json
import socket
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import aaa

WAIT_S = 20.0


def same(a: Any, b: Any) -> bool:
    """Equal as JSON, types included: 250 and 250.0 differ (plain == says they are equal)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


async def collect(run: aaa.Run, **kwargs: Any) -> list[aaa.Event]:
    """All events of run.events(**kwargs), waiting at most WAIT_S."""

    async def gather() -> list[aaa.Event]:
        return [e async for e in run.events(**kwargs)]

    return await asyncio.wait_for(gather(), WAIT_S)


async def next_item(iterator: AsyncIterator[Any], timeout: float = WAIT_S) -> Any:
    """The iterator's next item, waiting at most ``timeout``."""
    return await asyncio.wait_for(iterator.__anext__(), timeout)


def of_type(events: list[aaa.Event], event_type: str) -> list[aaa.Event]:
    """The events of one type."""
    return [e for e in events if e.type == event_type]


def closed_port() -> int:
    """A port of 127.0.0.1 that nothing listens on: bound, read, closed."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Proxy:
    """A TCP proxy on 127.0.0.1 whose connections can be cut, to simulate a dropped network."""

    def __init__(self, target: str) -> None:
        self.target_host, port = target.rsplit(":", 1)
        self.target_port = int(port)
        self.transports: list[asyncio.Transport] = []
        self.server: asyncio.Server | None = None
        self.address = ""

    async def start(self) -> Proxy:
        """Listen on a free port."""
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        self.address = "127.0.0.1:%d" % self.server.sockets[0].getsockname()[1]
        return self

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection(self.target_host, self.target_port)
        self.transports += [writer.transport, up_writer.transport]

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.transport.abort()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    def drop(self) -> int:
        """Abort every open connection; return how many were cut."""
        cut = [t for t in self.transports if not t.is_closing()]
        for transport in cut:
            transport.abort()
        self.transports.clear()
        return len(cut)

    async def close(self) -> None:
        """Stop listening and cut everything."""
        self.drop()
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(cwd: Path) -> None:
    """A test CA in ``cwd``: ca.key, ca.pem."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem", cwd=cwd)


def sign(name: str, cwd: Path, extensions: str) -> None:
    """A P-256 key and a certificate for ``name`` signed by ca.pem: NAME.key, NAME.pem."""
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-subj", f"/CN={name}", "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=cwd)
    (cwd / f"{name}.ext").write_text(extensions)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.pem", cwd=cwd)


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
