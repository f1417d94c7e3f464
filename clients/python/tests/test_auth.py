"""Tokens and TLS: a server with an auth config, reached over TLS with a bearer token or a
client certificate; refusals surface as aaa.Unauthenticated and aaa.PermissionDenied (and its
kinds, such as the worker's aaa.NotAllowedToServe and aaa.IdentityTaken)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import grpc
import pytest

import aaa
from aaa import echo, text, tool, tool_call
from aaa.pb import worker_pb2

from conftest import start_server, stop_process
from helpers import WAIT_S, closed_port, make_ca, sha256_hex, sign

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def tls_server(tmp_path_factory: pytest.TempPathFactory):
    """A TLS server whose principals are "runner" and "approver" (tokens), "robot" (its client
    certificate), and the workers "payments" and "intruder" (tokens), both allowed to serve
    the tool wire_money only."""
    root = tmp_path_factory.mktemp("auth")
    make_ca(root)
    sign("localhost", root, "subjectAltName=DNS:localhost,IP:127.0.0.1\n")
    sign("robot", root, "extendedKeyUsage=clientAuth\n")
    robot_der = subprocess.run(
        ["openssl", "x509", "-in", "robot.pem", "-outform", "DER"], cwd=root, check=True, capture_output=True
    ).stdout
    (root / "auth.toml").write_text(
        '[tls]\ncert = "localhost.pem"\nkey = "localhost.key"\nclient_ca = "ca.pem"\n\n'
        f'[[principal]]\nname = "runner"\nroles = ["runner"]\ntoken_sha256 = "{sha256_hex(b"runner-token")}"\n\n'
        f'[[principal]]\nname = "approver"\nroles = ["approver"]\ntoken_sha256 = "{sha256_hex(b"approver-token")}"\n\n'
        f'[[principal]]\nname = "robot"\nroles = ["runner"]\ncert_sha256 = "{sha256_hex(robot_der)}"\n\n'
        f'[[principal]]\nname = "payments"\nroles = ["worker"]\ntools = ["wire_money"]\n'
        f'token_sha256 = "{sha256_hex(b"payments-token")}"\n\n'
        f'[[principal]]\nname = "intruder"\nroles = ["worker"]\ntools = ["wire_money"]\n'
        f'token_sha256 = "{sha256_hex(b"intruder-token")}"\n'
    )
    srv = start_server(root / "data", root / "server.log", extra_args=("--auth-config", str(root / "auth.toml")))
    srv.pki = root
    yield srv
    stop_process(srv.process)


def _credentials(pki: Path, client_cert: bool = False) -> grpc.ChannelCredentials:
    ca = (pki / "ca.pem").read_bytes()
    if not client_cert:
        return grpc.ssl_channel_credentials(root_certificates=ca)
    return grpc.ssl_channel_credentials(
        root_certificates=ca,
        private_key=(pki / "robot.key").read_bytes(),
        certificate_chain=(pki / "robot.pem").read_bytes(),
    )


def _address(server) -> str:
    # The server certificate names localhost.
    return "localhost:" + server.address.rsplit(":", 1)[1]


async def test_a_token_names_the_caller_in_the_events(tls_server):
    creds = _credentials(tls_server.pki)
    async with await aaa.connect(_address(tls_server), token="runner-token", credentials=creds) as client:
        run = await client.start_run("hello", model=[text("done")])
        started = await run.wait_for("aaa.run.started")
        assert started.actor == aaa.Actor(kind="client", name="runner")
        assert (await run.result(timeout=WAIT_S)).value == {"text": "done"}


async def test_tls_and_a_token_work_the_same_with_a_list_of_addresses(tls_server):
    creds = _credentials(tls_server.pki)
    addresses = [f"localhost:{closed_port()}", _address(tls_server)]
    async with await aaa.connect(addresses, token="runner-token", credentials=creds) as client:
        run = await client.start_run("hello", model=[text("done")])
        started = await run.wait_for("aaa.run.started")
        assert started.actor == aaa.Actor(kind="client", name="runner")
        assert (await run.result(timeout=WAIT_S)).value == {"text": "done"}


async def test_a_client_certificate_authenticates_without_a_token(tls_server):
    creds = _credentials(tls_server.pki, client_cert=True)
    async with await aaa.connect(_address(tls_server), credentials=creds) as client:
        run = await client.start_run("hello", model=[text("done")])
        started = await run.wait_for("aaa.run.started")
        assert started.actor == aaa.Actor(kind="client", name="robot")


async def test_missing_or_unknown_tokens_are_unauthenticated(tls_server):
    creds = _credentials(tls_server.pki)
    for token in (None, "wrong-token"):
        async with await aaa.connect(_address(tls_server), token=token, credentials=creds) as client:
            with pytest.raises(aaa.Unauthenticated) as err:
                await client.start_run("hello", model=[text("done")])
            assert err.value.code == grpc.StatusCode.UNAUTHENTICATED and err.value.reason == "UNAUTHENTICATED"


async def test_a_missing_role_is_permission_denied_naming_the_roles(tls_server):
    creds = _credentials(tls_server.pki)
    async with await aaa.connect(_address(tls_server), token="approver-token", credentials=creds) as client:
        with pytest.raises(aaa.PermissionDenied) as err:
            await client.start_run("hello", model=[text("done")])
        assert err.value.reason == "PERMISSION_DENIED"
        assert err.value.metadata["roles"] == "runner,admin"


@tool(name="wire_money")
def wire_money(amount: int) -> dict:
    """Pretends to send money."""
    return {"sent": amount}


@tool(name="send_email")
def send_email(to: str) -> str:
    """Not in any principal's tools."""
    return to


async def test_a_worker_principal_serves_only_its_tools_under_an_identity_it_owns(tls_server):
    creds = _credentials(tls_server.pki)
    address = _address(tls_server)
    async with (
        await aaa.connect(address, token="payments-token", credentials=creds) as payments,
        await aaa.connect(address, token="intruder-token", credentials=creds) as intruder,
        await aaa.connect(address, token="runner-token", credentials=creds) as runner,
    ):
        # A tool the principal's `tools` do not list.
        with pytest.raises(aaa.NotAllowedToServe) as refused:
            await payments.worker(tools=[send_email], identity="payments-1").register()
        assert isinstance(refused.value, aaa.PermissionDenied)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.reason == "NOT_ALLOWED_TO_SERVE"
        assert refused.value.metadata["tool"] == "send_email"

        # payments-1 is payments' from its first use on: intruder may not register or poll as it,
        # even for a tool intruder may serve.
        async with payments.worker(tools=[wire_money], identity="payments-1"):
            with pytest.raises(aaa.IdentityTaken) as taken:
                await intruder.worker(tools=[wire_money], identity="payments-1").register()
            assert isinstance(taken.value, aaa.PermissionDenied)
            assert taken.value.reason == "IDENTITY_TAKEN" and taken.value.metadata["identity"] == "payments-1"
            poll = worker_pb2.PollTaskRequest(identity="payments-1", tools=["wire_money"], wait_s=0.1)
            with pytest.raises(aaa.IdentityTaken) as taken:
                await intruder._call(intruder.stubs.worker.PollTask, poll)
            assert taken.value.metadata["identity"] == "payments-1"

            # The owner serves a run; the events name its identity and its principal.
            run = await runner.start_run("pay", model=[tool_call(wire_money, amount=5), echo()], tools=[wire_money])
            assert (await run.result(timeout=WAIT_S)).ok
        completed = await run.wait_for("aaa.tool.completed")
        assert completed.actor == aaa.Actor(kind="worker", name="payments-1", principal="payments")
        started = await run.wait_for("aaa.run.started")
        assert started.actor == aaa.Actor(kind="client", name="runner", principal="")
