"""Which server a call goes to: the gRPC target of a list of servers (round robin over them), the
shard of a run, and the map of the runs' owners that sends a run's writes straight to its owner.

Beneath the connection (``_connection``) and everything that writes to runs (``Run``, the worker).
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import string
import time
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import grpc
import grpc.aio

from ._proto.aaa.v1 import cluster_pb2, run_pb2_grpc, worker_pb2_grpc
from .errors import AaaError, Unavailable

log = logging.getLogger("aaa.client")

T = TypeVar("T")

#: How old the map of run owners may get before a write of a run refreshes it (in the background).
OWNERS_MAX_AGE_S = 5.0
#: How long one GetCluster that reads the owners waits.
GET_CLUSTER_TIMEOUT_S = 5.0


def host_port(address: str) -> tuple[str, str]:
    """The host and port of "host:port" or "[ipv6]:port"."""
    host, sep, port = address.rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit():
        raise ValueError(f"a server address in a list must be host:port, not {address!r}")
    return host, port


def cluster_target(addresses: Sequence[str]) -> str:
    """The gRPC target of several servers: "ipv4:IP:PORT,..." or "ipv6:[IP]:PORT,...".

    gRPC has no target naming several hosts, only several IP addresses of one family, so host
    names are resolved here, once. A name that does not resolve is left out; an error if none
    does. IPv4 is used when every server has an IPv4 address, else IPv6 when every one has one.
    """
    by_family: dict[int, list[str]] = {4: [], 6: []}
    servers: list[set[int]] = []  # the families of each server that resolved
    for address in addresses:
        host, port = host_port(address)
        try:
            ips = [ipaddress.ip_address(host)]
        except ValueError:
            try:
                infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            except socket.gaierror:
                continue
            ips = [ipaddress.ip_address(str(info[4][0])) for info in infos]
        servers.append({ip.version for ip in ips})
        for ip in ips:
            endpoint = f"{ip}:{port}" if ip.version == 4 else f"[{ip}]:{port}"
            if endpoint not in by_family[ip.version]:
                by_family[ip.version].append(endpoint)
    if not servers:
        raise Unavailable(
            f"none of the server addresses {', '.join(addresses)} resolves", code=grpc.StatusCode.UNAVAILABLE
        )
    for version in (4, 6):
        if all(version in families for families in servers):
            return f"ipv{version}:" + ",".join(by_family[version])
    raise ValueError(f"the servers {', '.join(addresses)} mix IPv4-only and IPv6-only hosts; gRPC cannot reach both")


def shard(run_id: str) -> int | None:
    """The shard of a run: the last byte of its id (the UUID's last two hex digits); None for an id
    that does not end in two hex digits (the server will refuse it).

    The server's rule (``RunId::shard``); tests/vectors/formats.json holds cases every language checks.
    """
    last_byte = run_id[-2:]
    if len(last_byte) != 2 or not all(c in string.hexdigits for c in last_byte):
        return None
    return int(last_byte, 16)


class RunOwners:
    """Which server of the client's list owns each run, so that a run's writes go straight to it.

    Any server of a cluster takes any call, but one that does not own the run forwards its writes
    (Signal, CancelRun, a task's reports) to the owner: a hop that costs both servers CPU and the
    call time. GetCluster names the owner of each shard of runs; a write whose owner is one of the
    client's addresses goes on a channel to that server, anything else on the round robin. The map
    is a hint only: a stale one sends a write to a server that forwards it, as without the map.

    Only with several addresses on a shared store: separate embedded servers in one list each
    claim every shard, and would be sent runs they do not have.

    Args:
        addresses: the servers the client was given.
        open_channel: opens a channel to one of them (with the client's token, TLS and options).
        read_cluster: makes one GetCluster call, waiting at most the given seconds.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        open_channel: Callable[[str], grpc.aio.Channel],
        read_cluster: Callable[[float], Awaitable[cluster_pb2.GetClusterResponse]],
    ) -> None:
        self.addresses = list(addresses)
        self._open_channel = open_channel
        self._read_cluster = read_cluster
        #: False with one address, and once GetCluster says the store is embedded.
        self.enabled = len(self.addresses) > 1
        self.owners: list[str] = []  # shard -> owner's address, "" while no server holds it
        self.read_at: float | None = None  # time.monotonic() of the read; None: unread or stale
        self._refresh: asyncio.Task[None] | None = None
        self._stubs: dict[str, SimpleNamespace] = {}  # address -> its channel and stubs

    def owner_address(self, run_id: str) -> str | None:
        """The address of the run's owner when it is one of the client's, else None."""
        run_shard = shard(run_id)
        if run_shard is None or run_shard >= len(self.owners):
            return None
        owner = self.owners[run_shard]
        # Only the servers the client was given: an advertised address may not be reachable from
        # here, and the client's TLS settings and authority are for those.
        return owner if owner in self.addresses else None

    def stubs_for(self, run_id: str) -> SimpleNamespace | None:
        """The stubs on a channel to the run's owner, or None to use the round robin.

        Starts a refresh of the map when it is older than OWNERS_MAX_AGE_S, without waiting for it.
        """
        if not self.enabled:
            return None
        if self.read_at is None or time.monotonic() - self.read_at > OWNERS_MAX_AGE_S:
            if self._refresh is None or self._refresh.done():
                self._refresh = asyncio.create_task(self.read(), name="aaa-read-run-owners")
        address = self.owner_address(run_id)
        if address is None:
            return None
        if address not in self._stubs:
            channel = self._open_channel(address)
            self._stubs[address] = SimpleNamespace(
                channel=channel,
                run=run_pb2_grpc.RunServiceStub(channel),
                worker=worker_pb2_grpc.WorkerServiceStub(channel),
            )
        return self._stubs[address]

    def for_run(
        self,
        run_id: str,
        method: Callable[[SimpleNamespace], Callable[..., Awaitable[T]]],
        round_robin: SimpleNamespace,
    ) -> Callable[..., Awaitable[T]]:
        """The stub method for a write of one run: ``method`` picks it from the stubs of the run's
        owner when known (see ``stubs_for``), else from ``round_robin``'s, at each call.

        A call to the owner that fails UNAVAILABLE marks the map stale (see ``mark_stale``).
        """

        async def call(request: Any, **kwargs: Any) -> T:
            owner_stubs = self.stubs_for(run_id)
            if owner_stubs is None:
                return await method(round_robin)(request, **kwargs)
            try:
                return await method(owner_stubs)(request, **kwargs)
            except grpc.aio.AioRpcError as err:
                if err.code() == grpc.StatusCode.UNAVAILABLE:
                    self.mark_stale()  # the owner is down or lost the run: it may have moved
                raise

        return call

    def mark_stale(self) -> None:
        """A write sent to an owner failed UNAVAILABLE: the run may have moved. Forget the map until
        it is read again, so that the retry goes round robin to a live server (which waits for the
        next owner) rather than to the dead owner again."""
        self.read_at = None
        self.owners = []

    async def read(self) -> None:
        """Read the map from GetCluster (any server of the list); on failure keep the one there is."""
        try:
            cluster = await self._read_cluster(GET_CLUSTER_TIMEOUT_S)
        except AaaError as err:
            log.debug("could not read the owners of the runs: %s", err)
            return
        if cluster.store == "embedded":
            self.enabled = False  # servers that share no store: each names itself the owner of all
            return
        self.owners = list(cluster.shard_owners)
        self.read_at = time.monotonic()

    async def close(self) -> None:
        """Stop a refresh in flight and close the channels to the owners."""
        if self._refresh is not None:
            self._refresh.cancel()
            await asyncio.gather(self._refresh, return_exceptions=True)
        for stubs in self._stubs.values():
            await stubs.channel.close(grace=None)
        self._stubs.clear()
