"""Server errors surface as typed exceptions carrying the ErrorInfo reason."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from google.rpc import error_details_pb2, status_pb2

import aaa
import aaa.errors
from aaa import echo, text, tool, tool_call
from aaa.pb import types_pb2, worker_pb2

from helpers import WAIT_S


async def test_unknown_run(client):
    with pytest.raises(aaa.RunNotFound) as err:
        await client.get_run("no-such-run")
    assert isinstance(err.value, aaa.NotFound) and isinstance(err.value, aaa.AaaError)
    assert err.value.code == grpc.StatusCode.NOT_FOUND and err.value.reason == "RUN_NOT_FOUND"
    with pytest.raises(aaa.RunNotFound):
        await client.run("no-such-run").signal("app.ping", {})
    with pytest.raises(aaa.RunNotFound):
        await client.run("no-such-run").result(timeout=WAIT_S)


async def test_bad_start_requests(client, uid):
    with pytest.raises(aaa.ToolNotRegistered) as err:
        await client.start_run("go", model=[text("hi")], tools=[f"never_registered_{uid}"])
    assert isinstance(err.value, aaa.InvalidArgument) and err.value.code == grpc.StatusCode.INVALID_ARGUMENT
    with pytest.raises(aaa.InvalidField) as err:
        await client.start_run("", model=[text("hi")])
    assert err.value.field == "task"


async def test_signal_rules(client, uid):
    @tool(name=f"gate_{uid}", requires_approval=True)
    def gate(x: int) -> int:
        """Gated."""
        return x

    async with client.worker(tools=[gate]):
        run = await client.start_run("go", model=[tool_call(gate, x=1), echo()], tools=[gate])
        request = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
        call_id = request.data["call_id"]
        for reserved in ("aaa.tool.completed", "aaa.run.completed", "aaa.approval.requested"):
            with pytest.raises(aaa.ReservedEventType) as err:
                await run.signal(reserved, {"call_id": call_id, "output": 1})
            assert isinstance(err.value, aaa.InvalidArgument)
        with pytest.raises(aaa.CallNotFound):
            await run.approve("no-such-call")
        with pytest.raises(aaa.ArgumentsMismatch):
            await run.approve(call_id, arguments_sha256="0" * 64)
        assert (await run.get()).status == aaa.RunStatus.WAITING_FOR_APPROVAL
        note = await run.signal("app.note", {"n": 1}, request_id=f"note-{uid}")
        retried = await run.signal("app.note", {"n": 1}, request_id=f"note-{uid}")
        assert note.seq > 0 and retried.seq == note.seq
        await run.approve(call_id)
        outcome = await run.result(timeout=WAIT_S)
    assert outcome.value == {"text": "1"}
    with pytest.raises(aaa.RunFinished) as err:
        await run.signal("app.ping", {})
    assert isinstance(err.value, aaa.FailedPrecondition) and err.value.code == grpc.StatusCode.FAILED_PRECONDITION


async def test_idempotent_start(client, uid):
    first = await client.start_run("once", model=[text("ok")], request_id=f"start-{uid}")
    again = await client.start_run("once", model=[text("ok")], request_id=f"start-{uid}")
    assert first.created and not again.created and again.id == first.id
    assert (await first.result(timeout=WAIT_S)).value == {"text": "ok"}


async def test_bad_tokens(client):
    with pytest.raises(aaa.InvalidToken) as err:
        await client._call(client.stubs.worker.HeartbeatTask, worker_pb2.HeartbeatTaskRequest(token="forged"))
    assert err.value.reason == "INVALID_TOKEN"


async def test_unreachable_server():
    with pytest.raises(aaa.Unavailable):
        await aaa.connect("127.0.0.1:1", timeout=0.5)


def _details_trailer(code: grpc.StatusCode, reason: str, metadata: dict[str, str] | None = None):
    """The grpc-status-details-bin trailer of a refusal with this reason."""
    info = error_details_pb2.ErrorInfo(reason=reason, domain=aaa.errors.DOMAIN, metadata=metadata or {})
    status = status_pb2.Status(code=code.value[0], message="refused")
    status.details.add().Pack(info)
    return (("grpc-status-details-bin", status.SerializeToString()),)


class _FakeRpcError(grpc.RpcError):
    """A failed call as grpc.aio reports it: a code and the status-details trailer."""

    def __init__(self, code: grpc.StatusCode, reason: str, metadata: dict[str, str] | None = None) -> None:
        self._code, self._trailers = code, _details_trailer(code, reason, metadata)

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return "refused"

    def trailing_metadata(self):
        return self._trailers


def test_every_error_reason_of_the_proto_has_its_class():
    reasons = set(types_pb2.ErrorReason.keys()) - {"ERROR_REASON_UNSPECIFIED"}
    assert reasons == set(aaa.errors._BY_REASON)
    for reason in reasons:
        err = aaa.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNKNOWN, reason))
        assert type(err) is aaa.errors._BY_REASON[reason] and err.reason == reason
    storage = aaa.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "STORAGE_UNAVAILABLE"))
    assert isinstance(storage, aaa.StorageUnavailable) and isinstance(storage, aaa.Unavailable)
    lost = aaa.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.UNAVAILABLE, "OWNERSHIP_LOST"))
    assert isinstance(lost, aaa.OwnershipLost) and isinstance(lost, aaa.Unavailable)
    no_owner = aaa.errors.from_rpc_error(
        _FakeRpcError(grpc.StatusCode.UNAVAILABLE, "OWNER_UNAVAILABLE", {"owner": "aaa-2"})
    )
    assert isinstance(no_owner, aaa.OwnerUnavailable) and isinstance(no_owner, aaa.Unavailable)
    assert no_owner.code == grpc.StatusCode.UNAVAILABLE and no_owner.metadata == {"owner": "aaa-2"}
    malformed = aaa.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, "MALFORMED_REQUEST"))
    assert isinstance(malformed, aaa.MalformedRequest) and isinstance(malformed, aaa.InvalidArgument)
    # A reason newer than the SDK falls back to the class of its status code.
    newer = aaa.errors.from_rpc_error(_FakeRpcError(grpc.StatusCode.NOT_FOUND, "SOMETHING_NEW"))
    assert type(newer) is aaa.NotFound and newer.reason == "SOMETHING_NEW"


async def test_owner_unavailable_is_retried_like_any_unavailable(client):
    """A server of a cluster whose owner does not answer yet: the call is retried until it does."""
    tries = []

    async def forwarded(request, timeout=None):
        tries.append(request)
        if len(tries) < 3:
            trailer = _details_trailer(grpc.StatusCode.UNAVAILABLE, "OWNER_UNAVAILABLE", {"owner": "aaa-2"})
            raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(*trailer), "no owner")
        return "answered"

    assert await client._call(forwarded, "request") == "answered" and len(tries) == 3
    tries.clear()
    with pytest.raises(aaa.OwnerUnavailable) as err:
        await client._call(forwarded, "request", retry=False)
    assert len(tries) == 1 and err.value.reason == "OWNER_UNAVAILABLE" and err.value.metadata["owner"] == "aaa-2"
