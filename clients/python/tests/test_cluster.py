"""Connecting to the servers of a cluster: a list of addresses, calls spread over those that answer,
a run's writes sent to its owner."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import ssl
import time
import urllib.request
from types import SimpleNamespace

import grpc
import pytest

import aaa
from aaa import text, tool, tool_call
from aaa._route import RunOwners, cluster_target

from conftest import start_server, stop_process
from helpers import WAIT_S, closed_port, make_ca, sha256_hex, sign

postgres_only = pytest.mark.skipif(
    os.environ.get("AAA_TEST_STORE") != "postgres", reason="servers sharing a store need AAA_TEST_STORE=postgres"
)


async def test_a_list_of_addresses_skips_the_server_that_is_down(server):
    port = server.address.rsplit(":", 1)[1]
    for addresses in (
        [f"127.0.0.1:{closed_port()}", server.address],
        [f"localhost:{closed_port()}", f"localhost:{port}"],  # host names are resolved
    ):
        async with await aaa.connect(addresses, timeout=WAIT_S) as client:
            assert client.addresses == addresses and client.address == ",".join(addresses)
            for _ in range(4):  # round robin: every call would reach the closed port in turn
                run = await client.start_run("hello", model=[text("done")])
                assert (await client.get_run(run.id)).task == "hello"
                assert (await run.result(timeout=WAIT_S)).value == {"text": "done"}


async def test_calls_are_spread_over_the_servers_of_the_list(tmp_path):
    # Two servers that share nothing: each run stays where it was started, so each one's list shows
    # how many of the calls it got.
    servers = [start_server(tmp_path / name, tmp_path / f"{name}.log") for name in ("a", "b")]
    try:
        async with await aaa.connect([s.address for s in servers], timeout=WAIT_S) as client:
            for _ in range(10):
                await client.start_run("hello", model=[text("done")])
        counts = []
        for s in servers:
            async with await aaa.connect(s.address) as client:
                counts.append(len(await client.list_runs()))
        # Evenly once both connections are up; the first calls may all go to the first one up.
        assert sum(counts) == 10 and min(counts) > 0, counts
    finally:
        for s in servers:
            stop_process(s.process)


async def test_a_list_of_addresses_none_of_which_answers_is_unavailable():
    with pytest.raises(aaa.Unavailable):
        await aaa.connect([f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"], timeout=0.5)
    with pytest.raises(ValueError):
        await aaa.connect([])


def test_cluster_targets():
    assert cluster_target(["127.0.0.1:1", "10.0.0.2:2"]) == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert cluster_target(["[::1]:1", "[fd00::2]:2"]) == "ipv6:[::1]:1,[fd00::2]:2"
    assert cluster_target(["localhost:1", "127.0.0.1:2"]).startswith("ipv4:127.0.0.1:1,")
    with pytest.raises(ValueError):
        cluster_target(["127.0.0.1:1", "[::1]:2"])  # one channel speaks one family
    with pytest.raises(ValueError):
        cluster_target(["127.0.0.1", "127.0.0.1:2"])  # no port
    with pytest.raises(aaa.Unavailable):
        cluster_target(["no-such-host.invalid:1"])


def requests_answered(
    address: str, method: str, tls: tuple[ssl.SSLContext, str] | None = None, code: str = r"\w+"
) -> int:
    """How many calls of ``method`` ("RunService/Signal") the server answered, any code (or only ``code``), from
    its /metrics; ``tls`` is (a context trusting the server's CA, a reader's token) for a server with TLS and auth."""
    request = urllib.request.Request(f"{'https' if tls else 'http'}://{address}/metrics")
    if tls:
        request.add_header("authorization", f"Bearer {tls[1]}")
    with urllib.request.urlopen(request, timeout=WAIT_S, context=tls[0] if tls else None) as response:
        metrics = response.read().decode()
    line = re.compile(rf'^aaa_api_requests_total{{method="{re.escape(method)}",code="{code}"}} (\d+)$', re.M)
    return sum(int(count) for count in line.findall(metrics))


def owner_and_standby(tmp_path, *args: str):
    """An owner (``--one-owner``) and a standby on one PostgreSQL schema, each started with ``args``."""
    owner = start_server(tmp_path / "owner", tmp_path / "owner.log", extra_args=("--one-owner", *args))
    # The standby on the owner's schema: store_args keeps a data dir's store URL beside it.
    (tmp_path / "standby.store-url").write_text((tmp_path / "owner.store-url").read_text())
    try:
        standby = start_server(tmp_path / "standby", tmp_path / "standby.log", extra_args=("--standby", *args))
    except BaseException:  # pytest.fail is not an Exception: the owner must not outlive the test
        stop_process(owner.process)
        raise
    return owner, standby


def gated_wire(uid: str):
    @tool(name=f"wire_{uid}", requires_approval=True)
    def wire(amount: int) -> str:
        """Send money."""
        return f"sent ${amount}"

    return wire


async def pay_with_approval(client: aaa.Client, wire, amount: int, owner) -> None:
    """A run that pays ``amount`` with ``wire`` once approved; checks the client routes it to ``owner``
    (read at connect: the owner holds every shard once it serves), approves, and waits for its end."""
    run = await client.start_run("pay", model=[tool_call(wire, amount=amount), text("done")], tools=[wire])
    requested = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
    assert client._owners.owner_address(run.id) == owner.address
    assert (await run.approve(requested.data["call_id"])).decision == "aaa.approval.granted"
    assert (await run.result(timeout=WAIT_S)).value == {"text": "done"}


@postgres_only
async def test_a_runs_writes_go_to_its_owner_not_through_a_standby(tmp_path, uid):
    owner, standby = owner_and_standby(tmp_path)
    writes = ("RunService/Signal", "RunService/CancelRun", "WorkerService/CompleteTask")
    wire = gated_wire(uid)
    try:
        # The standby first: without routing, the round robin sends it about half of the writes.
        async with await aaa.connect([standby.address, owner.address], timeout=WAIT_S) as client:
            async with client.worker(tools=[wire]):
                for amount in (1, 2, 3):
                    await pay_with_approval(client, wire, amount, owner)
                cancelled = await client.start_run("pay", model=[tool_call(wire, amount=4)], tools=[wire])
                await asyncio.wait_for(cancelled.wait_for("aaa.approval.requested"), WAIT_S)
                assert await cancelled.cancel("no") > 0
            # The writes went on the owner's own channel, not by luck of the round robin.
            assert client._owners._stubs[owner.address].channel.get_state() == grpc.ChannelConnectivity.READY
        assert [requests_answered(standby.address, method) for method in writes] == [0, 0, 0]
        assert [requests_answered(owner.address, method) for method in writes] == [3, 1, 3]
    finally:
        stop_process(standby.process)
        stop_process(owner.process)


@postgres_only
async def test_a_write_whose_owner_was_killed_reaches_the_next_owner(tmp_path, uid):
    owner, standby = owner_and_standby(tmp_path, "--lease-s", "1")
    wire = gated_wire(uid)
    try:
        async with await aaa.connect([standby.address, owner.address], timeout=WAIT_S) as client:
            async with client.worker(tools=[wire]):
                run = await client.start_run("pay", model=[tool_call(wire, amount=1), text("done")], tools=[wire])
                requested = await asyncio.wait_for(run.wait_for("aaa.approval.requested"), WAIT_S)
                assert client._owners.owner_address(run.id) == owner.address
                owner.process.kill()
                owner.process.wait()
                # The map still names the dead owner: the grant goes there first, fails UNAVAILABLE,
                # and the retry goes round robin to the standby, which takes the runs over within
                # the lease and serves it.
                granted = await asyncio.wait_for(run.approve(requested.data["call_id"]), WAIT_S)
                assert granted.decision == "aaa.approval.granted"
                assert (await run.result(timeout=WAIT_S)).value == {"text": "done"}
                await client._owners.read()
                assert client._owners.owner_address(run.id) == standby.address
        assert requests_answered(standby.address, "RunService/Signal") >= 1
        # The tool's result, answered OK (a try that came before the standby had taken the runs
        # over was answered UNAVAILABLE and sent again).
        assert requests_answered(standby.address, "WorkerService/CompleteTask", code="OK") == 1
    finally:
        stop_process(standby.process)
        stop_process(owner.process)


@postgres_only
@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")
async def test_over_tls_a_runs_writes_go_to_its_owner(tmp_path, uid):
    # Both servers with TLS (a certificate for 127.0.0.1, the address they advertise) and a token.
    pki = tmp_path / "pki"
    pki.mkdir()
    make_ca(pki)
    sign("localhost", pki, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    auth = pki / "auth.toml"
    auth.write_text(
        '[tls]\ncert = "localhost.pem"\nkey = "localhost.key"\n\n'
        f'[[principal]]\nname = "boss"\nroles = ["admin"]\ntoken_sha256 = "{sha256_hex(b"boss-token")}"\n'
    )
    owner, standby = owner_and_standby(tmp_path, "--auth-config", str(auth))
    credentials = grpc.ssl_channel_credentials(root_certificates=(pki / "ca.pem").read_bytes())
    tls = (ssl.create_default_context(cafile=str(pki / "ca.pem")), "boss-token")
    wire = gated_wire(uid)
    try:
        addresses = [standby.address, owner.address]
        async with await aaa.connect(addresses, token="boss-token", credentials=credentials, timeout=WAIT_S) as client:
            async with client.worker(tools=[wire]):
                for amount in (1, 2):
                    await pay_with_approval(client, wire, amount, owner)
            # The owner's channel is a TLS one with the token: a channel that could not connect
            # (say, without TLS) would leave the writes to the round robin, which may reach the
            # owner as well.
            assert client._owners._stubs[owner.address].channel.get_state() == grpc.ChannelConnectivity.READY
        writes = ("RunService/Signal", "WorkerService/CompleteTask")
        assert [requests_answered(standby.address, method, tls) for method in writes] == [0, 0]
        assert [requests_answered(owner.address, method, tls) for method in writes] == [2, 2]
    finally:
        stop_process(standby.process)
        stop_process(owner.process)


async def test_servers_that_share_no_store_are_not_routed(tmp_path, monkeypatch):
    # Embedded whatever the suite's store: each server says it owns every shard.
    monkeypatch.delenv("AAA_TEST_STORE", raising=False)
    servers = [start_server(tmp_path / name, tmp_path / f"{name}.log") for name in ("a", "b")]
    try:
        async with await aaa.connect([s.address for s in servers], timeout=WAIT_S) as client:
            assert client._owners.enabled is False and client._owners.owners == []
            run = await client.start_run("hello", model=[text("done")])
            assert client._owners.stubs_for(run.id) is None
        async with await aaa.connect(servers[0].address, timeout=WAIT_S) as client:
            assert client._owners.enabled is False  # one address: nothing to choose
    finally:
        for s in servers:
            stop_process(s.process)


def test_a_runs_owner():
    # The shard of a run id: see test_vectors.py. The map is set by hand: nothing is opened or read.
    owners = RunOwners(["10.0.0.1:50051", "[::1]:50052", "db.internal:50053"], open_channel=None, read_cluster=None)
    owners.owners = ["10.0.0.1:50051"] * 256
    owners.owners[1:5] = ["[::1]:50052", "db.internal:50053", "", "10.0.0.9:50051"]
    assert owners.owner_address("run-00") == "10.0.0.1:50051"
    assert owners.owner_address("run-01") == "[::1]:50052"
    assert owners.owner_address("run-02") == "db.internal:50053"  # as given: not resolved
    assert owners.owner_address("run-03") is None  # no server holds the shard
    assert owners.owner_address("run-04") is None  # not one of the client's servers
    assert owners.owner_address("run-zz") is None
    owners.owners = []
    assert owners.owner_address("run-00") is None  # no map


async def test_a_write_the_owner_does_not_answer_marks_the_owners_stale():
    client = aaa.Client([f"127.0.0.1:{closed_port()}", f"127.0.0.1:{closed_port()}"])
    owner = client.addresses[1]
    client._owners.owners, client._owners.read_at = [owner] * 256, time.monotonic()
    sent = []

    async def unavailable(request, timeout=None):
        sent.append(request)
        raise grpc.aio.AioRpcError(grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "gone")

    client._owners._stubs[owner] = SimpleNamespace(run=SimpleNamespace(Signal=unavailable))  # its channel's place
    try:
        with pytest.raises(aaa.Unavailable):
            await client._call(client._for_run("run-07", lambda stubs: stubs.run.Signal), "signal", retry=False)
        # Forgotten until read again: the retry goes round robin, not to the dead owner again.
        assert sent == ["signal"] and client._owners.read_at is None
        assert client._owners.owner_address("run-07") is None
    finally:
        client._owners._stubs.clear()
        await client.close()
