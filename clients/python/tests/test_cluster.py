"""Connecting to the servers of a cluster: a list of addresses, calls spread over those that answer."""

from __future__ import annotations

import pytest

import aaa
from aaa import text
from aaa.client import _cluster_target

from conftest import start_server, stop_process
from helpers import WAIT_S, closed_port


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
    assert _cluster_target(["127.0.0.1:1", "10.0.0.2:2"]) == "ipv4:127.0.0.1:1,10.0.0.2:2"
    assert _cluster_target(["[::1]:1", "[fd00::2]:2"]) == "ipv6:[::1]:1,[fd00::2]:2"
    assert _cluster_target(["localhost:1", "127.0.0.1:2"]).startswith("ipv4:127.0.0.1:1,")
    with pytest.raises(ValueError):
        _cluster_target(["127.0.0.1:1", "[::1]:2"])  # one channel speaks one family
    with pytest.raises(ValueError):
        _cluster_target(["127.0.0.1", "127.0.0.1:2"])  # no port
    with pytest.raises(aaa.Unavailable):
        _cluster_target(["no-such-host.invalid:1"])
