"""The connection to an aaa server or to the servers of a cluster: channels with the token, TLS
settings and options, the generated stubs, unary calls retried while the server is unavailable, and a
run's writes sent to its owner.

``Connection`` is what everything that makes calls needs (the worker, the subscriptions, a run's
handle); ``aaa.Client`` is a ``Connection`` with the SDK's calls on top.
"""

from __future__ import annotations

import json
import os
from types import SimpleNamespace
from typing import Any, Awaitable, Callable, Sequence, TypeVar

import grpc
import grpc.aio

from ._backoff import Backoff, transient
from ._proto.aaa.v1 import (
    approval_pb2_grpc,
    cluster_pb2,
    cluster_pb2_grpc,
    grant_pb2_grpc,
    policy_pb2_grpc,
    run_pb2_grpc,
    subscription_pb2_grpc,
    worker_pb2_grpc,
)
from ._route import RunOwners, cluster_target
from .errors import from_rpc_error

#: The address used when none is given and AAA_SERVER is not set.
DEFAULT_ADDRESS = "127.0.0.1:50051"

T = TypeVar("T")

_CHANNEL_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 2000),
    ("grpc.keepalive_time_ms", 30000),
    ("grpc.keepalive_timeout_ms", 10000),
]


#: The service config of a channel to several servers: each call goes to the next one that answers.
_ROUND_ROBIN = json.dumps({"loadBalancingConfig": [{"round_robin": {}}]})


class _BearerDetails:
    """Adds ``authorization: Bearer TOKEN`` to a call's metadata."""

    def __init__(self, token: str) -> None:
        self._value = f"Bearer {token}"

    def _details(self, details: Any) -> Any:
        metadata = grpc.aio.Metadata(*(details.metadata or ()))
        metadata.add("authorization", self._value)
        return details._replace(metadata=metadata)


# grpc.aio files each interceptor under one call kind only: one class per kind.
class _BearerUnaryUnary(_BearerDetails, grpc.aio.UnaryUnaryClientInterceptor):
    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerUnaryStream(_BearerDetails, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(self._details(details), request)


class _BearerStreamUnary(_BearerDetails, grpc.aio.StreamUnaryClientInterceptor):
    async def intercept_stream_unary(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


class _BearerStreamStream(_BearerDetails, grpc.aio.StreamStreamClientInterceptor):
    async def intercept_stream_stream(self, continuation: Any, details: Any, requests: Any) -> Any:
        return await continuation(self._details(details), requests)


def _bearer(token: str) -> list[Any]:
    kinds = (_BearerUnaryUnary, _BearerUnaryStream, _BearerStreamUnary, _BearerStreamStream)
    return [kind(token) for kind in kinds]

class Connection:
    """Channels to an aaa server (or to the servers of a cluster) and the stubs on them.

    Attributes:
        address: the server address (those of a list joined by commas).
        addresses: the server addresses, one unless a list was given.
        retry_s: how long calls keep retrying while the server is unavailable.
        stubs: the generated gRPC stubs (``stubs.run``, ``stubs.approval``, ``stubs.worker``,
            ``stubs.subscription``, ``stubs.policy``, ``stubs.grant``).
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        retry_s: float = 30.0,
    ) -> None:
        if address is None or isinstance(address, str):
            self.addresses = [address or os.environ.get("AAA_SERVER") or DEFAULT_ADDRESS]
        else:
            self.addresses = list(address)
            if not self.addresses:
                raise ValueError("connect needs at least one server address")
        self.address = ",".join(self.addresses)
        self.retry_s = retry_s
        token = token or os.environ.get("AAA_TOKEN")
        self._interceptors = _bearer(token) if token else None
        self._credentials = credentials
        self._options = list(_CHANNEL_OPTIONS)
        if len(self.addresses) == 1:
            self._channel = self._open_channel(self.addresses[0])
        else:
            # One authority for all, the channels to the runs' owners too: the first address
            # (the name TLS checks the certificates for).
            self._options.append(("grpc.default_authority", self.addresses[0]))
            target = cluster_target(self.addresses)
            self._channel = self._open_channel(target, [("grpc.service_config", _ROUND_ROBIN)])
        self.stubs = SimpleNamespace(
            run=run_pb2_grpc.RunServiceStub(self._channel),
            approval=approval_pb2_grpc.ApprovalServiceStub(self._channel),
            worker=worker_pb2_grpc.WorkerServiceStub(self._channel),
            subscription=subscription_pb2_grpc.SubscriptionServiceStub(self._channel),
            policy=policy_pb2_grpc.PolicyServiceStub(self._channel),
            grant=grant_pb2_grpc.GrantServiceStub(self._channel),
        )
        self._cluster = cluster_pb2_grpc.ClusterServiceStub(self._channel)
        self._owners = RunOwners(self.addresses, self._open_channel, self._read_cluster)

    def _open_channel(self, target: str, extra_options: Sequence[tuple[str, Any]] = ()) -> grpc.aio.Channel:
        """A channel with the client's token, TLS settings and options."""
        options = self._options + list(extra_options)
        if self._credentials is None:
            return grpc.aio.insecure_channel(target, options=options, interceptors=self._interceptors)
        return grpc.aio.secure_channel(target, self._credentials, options=options, interceptors=self._interceptors)

    async def close(self) -> None:
        """Close the connection; calls still in flight are cancelled."""
        await self._owners.close()
        await self._channel.close(grace=None)

    def _for_run(
        self, run_id: str, method: Callable[[SimpleNamespace], Callable[..., Awaitable[T]]]
    ) -> Callable[..., Awaitable[T]]:
        """The stub method for a write of one run, to use where the stub method would be (e.g. in
        ``_call``). ``method`` picks it from a set of stubs, e.g. ``lambda stubs: stubs.run.Signal``.

        Each call of it goes to the run's owner when the client knows it (see ``RunOwners``), else
        on the round robin. The channels share the token, TLS settings and options, and the caller's
        retries and deadlines apply as to any call; a retry picks the owner again.
        """
        return self._owners.for_run(run_id, method, self.stubs)

    async def _read_cluster(self, timeout: float) -> cluster_pb2.GetClusterResponse:
        """One GetCluster on the round robin, not retried (the map of owners is only a hint)."""
        return await self._call(self._cluster.GetCluster, cluster_pb2.GetClusterRequest(), timeout=timeout, retry=False)

    async def _call(
        self,
        method: Callable[..., Awaitable[T]],
        request: Any,
        *,
        timeout: float | None = None,
        retry: bool = True,
        metadata: Any = None,
    ) -> T:
        """Make a unary call, retrying UNAVAILABLE, and raise typed errors."""
        backoff = Backoff(self.retry_s if retry else 0.0)
        while True:
            try:
                if metadata:
                    return await method(request, timeout=timeout, metadata=metadata)
                return await method(request, timeout=timeout)
            except grpc.aio.AioRpcError as err:
                if transient(err) and await backoff.wait():
                    continue
                raise from_rpc_error(err) from err

