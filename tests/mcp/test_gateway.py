"""aaa as an MCP gateway, end to end with real processes: the aaa binary
(AAA_BIN, default target/debug/aaa) with an auth config and an --mcp file
whose upstream is tests/mcp/upstream.py (the MCP SDK's MCPServer over
stdio, logging each execution), and the official MCP Python SDK as the
client. Approvals are decided with the aaa CLI, as an approver would."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

REPO = Path(__file__).resolve().parents[2]
AAA = Path(os.environ.get("AAA_BIN", REPO / "target" / "debug" / "aaa"))
UPSTREAM = Path(__file__).with_name("upstream.py")
TOKENS = {"runner": "mcp-runner-token", "approver": "alice-token", "reader": "reader-token"}
# An upstream credential: it must never show in aaa's log, events or errors.
UPSTREAM_SECRET = "upstream-secret-5f1d2c"
WAIT_S = 20.0


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


class Gateway:
    def __init__(self, root: Path):
        self.root = root
        self.log = root / "executions.jsonl"
        self.log.touch()
        (root / "auth.toml").write_text(
            f"""
[[principal]]
name = "mcp-runner"
roles = ["runner"]
token_sha256 = "{sha256(TOKENS['runner'])}"

[[principal]]
name = "alice"
roles = ["approver", "reader"]
token_sha256 = "{sha256(TOKENS['approver'])}"

[[principal]]
name = "just-a-reader"
roles = ["reader"]
token_sha256 = "{sha256(TOKENS['reader'])}"
"""
        )
        (root / "mcp.toml").write_text(
            f"""
[[upstream]]
name = "bank"
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(UPSTREAM))}]
env = {{ AAA_MCP_TEST_LOG = {json.dumps(str(self.log))}, BANK_TOKEN = "{UPSTREAM_SECRET}" }}

[[upstream.tool]]
name = "echo"

[[upstream.tool]]
name = "wire_money"
requires_approval = true

[[upstream.tool]]
name = "refuse"
expose_as = "bank_refuse"

[[upstream.tool]]
name = "wire_money"
expose_as = "wire_money_soon"
requires_approval = true
approval_timeout_s = 1
"""
        )
        # The same upstream over Streamable HTTP, its key from aaa's environment.
        self.http_port = free_port()
        self.upstream_log = open(root / "upstream-http.log", "w")
        self.http_upstream = subprocess.Popen(
            [sys.executable, str(UPSTREAM), "--http", str(self.http_port)],
            env={**os.environ, "AAA_MCP_TEST_LOG": str(self.log)},
            stdout=self.upstream_log, stderr=subprocess.STDOUT)
        wait_listening(self.http_port)
        with open(root / "mcp.toml", "a") as mcp:
            mcp.write(f"""
[[upstream]]
name = "bank-http"
url = "http://127.0.0.1:{self.http_port}/mcp"
headers_from_env = {{ X-Bank-Key = "BANK_KEY" }}

[[upstream.tool]]
name = "echo"
expose_as = "http_echo"
""")
        try:
            self.start_aaa()
        except BaseException:
            self.http_upstream.kill()
            self.http_upstream.wait()
            raise

    def start_aaa(self) -> None:
        root = self.root
        self.stderr = open(root / "aaa.log", "w")
        args = [str(AAA), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(root / "data"),
                "--auth-config", str(root / "auth.toml"), "--mcp", str(root / "mcp.toml")]
        if os.environ.get("AAA_TEST_STORE") == "postgres":
            # The same store again when restarted.
            self.store = getattr(self, "store", None) or store_url(root)
            args += ["--store", self.store]
        self.process = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.stderr, text=True,
                                        env={**os.environ, "BANK_KEY": UPSTREAM_SECRET})
        line = self.process.stdout.readline()
        match = re.search(r"serving on (\S+:\d+)", line)
        assert match, f"aaa did not start: {line!r}\n{(root / 'aaa.log').read_text()[-2000:]}"
        self.address = match.group(1)
        self.url = f"http://{self.address}/mcp"

    def client(self, role: str | None = "runner", mode: str = "legacy") -> Client:
        headers = {"Authorization": f"Bearer {TOKENS[role]}"} if role else {}
        http = httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30.0, read=300.0))
        return Client(streamable_http_client(self.url, http_client=http), mode=mode)

    def cli(self, *args: str, ok: tuple[int, ...] = (0,)) -> str:
        done = subprocess.run([str(AAA), *args, "--server", self.address, "--token", TOKENS["approver"]],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode in ok, f"aaa {' '.join(args)}: {done.stderr}"
        return done.stdout

    def executions(self, tool: str) -> list[dict]:
        lines = [json.loads(line) for line in self.log.read_text().splitlines() if line.strip()]
        return [line for line in lines if line["tool"] == tool]

    async def pending(self, tool: str) -> dict:
        """The one pending approval of `tool`, once aaa shows it to approvers."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            listed = json.loads(self.cli("approvals", "ls", "--json"))["approvals"]
            found = [a for a in listed if a["tool"] == tool]
            if found:
                assert len(found) == 1, found
                return found[0]
            await asyncio.sleep(0.05)
        pytest.fail(f"no pending approval of {tool} within {WAIT_S}s")

    def stop(self) -> None:
        if self.process.poll() is not None:
            self.stderr.close()
            self.stderr = open(os.devnull, "w")
        self.process.terminate()
        self.process.wait(timeout=30)
        self.stderr.close()
        self.http_upstream.terminate()
        self.http_upstream.wait(timeout=30)
        self.upstream_log.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_listening(port: int) -> None:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.05)
    pytest.fail(f"the HTTP upstream did not listen on {port} within {WAIT_S}s")


def store_url(root: Path) -> str:
    """A fresh schema of AAA_TEST_POSTGRES (aaa makes it), as the SDKs' tests do."""
    import uuid

    base = os.environ["AAA_TEST_POSTGRES"]
    separator = "&" if "?" in base else "?"
    return f"{base}{separator}options=-csearch_path%3Daaa_test_{uuid.uuid4().hex}"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory):
    gw = Gateway(tmp_path_factory.mktemp("mcp"))
    yield gw
    gw.stop()
    log = (gw.root / "aaa.log").read_text()
    assert UPSTREAM_SECRET not in log, "an upstream credential reached aaa's log"


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 120))


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_lists_the_exposed_tools(gateway: Gateway, mode: str):
    async def body():
        async with gateway.client(mode=mode) as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert sorted(tools) == ["bank_refuse", "echo", "http_echo", "wire_money", "wire_money_soon"]
            assert tools["wire_money"].input_schema["properties"]["amount"]["type"] == "integer"

    run(body())


@pytest.mark.parametrize("mode", ["legacy", "auto"])
def test_an_ungated_call_goes_straight_through(gateway: Gateway, mode: str):
    async def body():
        before = len(gateway.executions("echo"))
        async with gateway.client(mode=mode) as client:
            result = await client.call_tool("echo", {"text": f"hello {mode}"})
        assert not result.is_error
        assert result.content[0].text == f"echo: hello {mode}"
        done = gateway.executions("echo")[before:]
        assert [d["arguments"] for d in done] == [{"text": f"hello {mode}"}]
        # The call id goes to the upstream as an idempotency hint.
        assert done[0]["meta"]["aaa/call_id"] == result.meta["aaa/call_id"]

    run(body())


def test_an_upstream_over_http_gets_its_headers(gateway: Gateway):
    async def body():
        async with gateway.client() as client:
            result = await client.call_tool("http_echo", {"text": "over http"})
        assert not result.is_error, result
        assert result.content[0].text == "echo: over http"
        done = [d for d in gateway.executions("echo") if d["arguments"] == {"text": "over http"}]
        assert len(done) == 1
        assert done[0]["bank_key"] == UPSTREAM_SECRET

    run(body())


def test_a_gated_call_waits_for_the_grant_and_runs_once(gateway: Gateway):
    async def body():
        progress: list[str] = []

        async def on_progress(value, total, message):
            progress.append(message or "")

        async with gateway.client() as client:
            call = asyncio.create_task(
                client.call_tool("wire_money", {"to": "ACME", "amount": 250}, progress_callback=on_progress))
            pending = await gateway.pending("wire_money")
            assert pending["arguments"] == {"to": "ACME", "amount": 250}
            # Nothing ran before the grant.
            assert gateway.executions("wire_money") == []
            assert not call.done()
            gateway.cli("approve", pending["run_id"], pending["call_id"], "--comment", "checked")
            result = await call
        assert not result.is_error, result
        assert result.content[0].text == "sent 250 to ACME"
        done = gateway.executions("wire_money")
        assert len(done) == 1
        assert done[0]["arguments"] == {"to": "ACME", "amount": 250}
        assert done[0]["meta"]["aaa/call_id"] == pending["call_id"]
        assert done[0]["meta"]["aaa/run_id"] == pending["run_id"]
        # The open request was told why it waits.
        assert any(f"{pending['call_id']} of run {pending['run_id']} waits for approval" in p for p in progress), progress

    run(body())


def test_an_edited_call_runs_with_the_edited_arguments(gateway: Gateway):
    async def body():
        before = len(gateway.executions("wire_money"))
        async with gateway.client() as client:
            call = asyncio.create_task(client.call_tool("wire_money", {"to": "ACME", "amount": 900}))
            pending = await gateway.pending("wire_money")
            gateway.cli("edit", pending["run_id"], pending["call_id"], "--arguments",
                        '{"to": "ACME", "amount": 200}', "--reason", "over the cap", "--grant")
            result = await call
        assert not result.is_error, result
        assert result.content[0].text == "sent 200 to ACME"
        done = gateway.executions("wire_money")[before:]
        assert [d["arguments"] for d in done] == [{"to": "ACME", "amount": 200}]

    run(body())


def test_aaa_mcp_serves_the_same_over_stdio(gateway: Gateway):
    """`aaa mcp --server ADDR`, launched by the client, relays to /mcp."""
    async def body():
        relay = StdioServerParameters(command=str(AAA), args=["mcp", "--server", gateway.address],
                                      env={**os.environ, "AAA_TOKEN": TOKENS["runner"]})
        progress: list[str] = []

        async def on_progress(value, total, message):
            progress.append(message or "")

        before = len(gateway.executions("wire_money"))
        async with Client(relay, mode="legacy") as client:
            tools = sorted(t.name for t in (await client.list_tools()).tools)
            assert tools == ["bank_refuse", "echo", "http_echo", "wire_money", "wire_money_soon"]
            call = asyncio.create_task(
                client.call_tool("wire_money", {"to": "STDIO", "amount": 7}, progress_callback=on_progress))
            pending = await gateway.pending("wire_money")
            gateway.cli("approve", pending["run_id"], pending["call_id"])
            result = await call
        assert result.content[0].text == "sent 7 to STDIO"
        assert any("waits for approval" in p for p in progress), progress
        assert [d["arguments"] for d in gateway.executions("wire_money")[before:]] == [{"to": "STDIO", "amount": 7}]

    run(body())


def test_aaa_mcp_ls_shows_upstreams_tools_and_gates(gateway: Gateway):
    done = subprocess.run([str(AAA), "mcp", "ls", "--mcp", str(gateway.root / "mcp.toml")],
                          capture_output=True, text=True, timeout=60,
                          env={**os.environ, "BANK_KEY": UPSTREAM_SECRET})
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("bank  command ") and lines[0].endswith("  reachable"), lines
    assert "  wire_money <- wire_money  gated, 1 approval(s)" in lines
    assert "  bank_refuse <- refuse  ungated" in lines
    assert f"bank-http  url http://127.0.0.1:{gateway.http_port}/mcp  reachable" in lines
    assert UPSTREAM_SECRET not in done.stdout + done.stderr


def test_an_unanswered_approval_times_out_as_a_tool_error(gateway: Gateway):
    async def body():
        before = len(gateway.executions("wire_money"))
        async with gateway.client() as client:
            # Nobody answers: the engine denies the request after its tool's 1 s.
            result = await client.call_tool("wire_money_soon", {"to": "LATE", "amount": 3})
            assert result.is_error
            assert result.content[0].text == "timeout"
            assert result.meta["aaa/error_type"] == "ApprovalDenied"
            # The session goes on in the same run.
            again = await client.call_tool("echo", {"text": "after the timeout"})
        assert not again.is_error
        assert again.meta["aaa/run_id"] == result.meta["aaa/run_id"]
        assert len(gateway.executions("wire_money")) == before

    run(body())


def test_a_denied_call_is_a_tool_error_with_the_reason(gateway: Gateway):
    async def body():
        before = len(gateway.executions("wire_money"))
        async with gateway.client() as client:
            call = asyncio.create_task(client.call_tool("wire_money", {"to": "EVIL", "amount": 1000}))
            pending = await gateway.pending("wire_money")
            gateway.cli("deny", pending["run_id"], pending["call_id"], "--reason", "not this vendor")
            result = await call
        assert result.is_error
        assert "not this vendor" in result.content[0].text
        assert len(gateway.executions("wire_money")) == before

    run(body())


def test_an_upstream_tool_error_is_a_tool_error(gateway: Gateway):
    async def body():
        async with gateway.client() as client:
            result = await client.call_tool("bank_refuse", {"reason": "insufficient funds"})
        assert result.is_error
        assert "insufficient funds" in result.content[0].text
        assert len(gateway.executions("refuse")) == 1

    run(body())


@pytest.mark.parametrize("role", ["reader", None])
def test_a_principal_without_the_runner_role_cannot_call(gateway: Gateway, role: str | None):
    before = len(gateway.executions("echo"))
    # What the HTTP layer answers: 403 naming the missing role, 401 without credentials.
    headers = {"Authorization": f"Bearer {TOKENS[role]}"} if role else {}
    initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-11-25", "capabilities": {},
                             "clientInfo": {"name": "sneaky", "version": "1"}}}
    answer = httpx2.post(gateway.url, json=initialize, timeout=10,
                         headers={**headers, "Accept": "application/json, text/event-stream"})
    if role:
        assert answer.status_code == 403, answer.text
        assert "needs the role runner" in answer.text
    else:
        assert answer.status_code == 401, answer.text

    # And the SDK's call fails without reaching the upstream.
    async def body():
        with pytest.raises(BaseException):
            async with gateway.client(role=role) as client:
                await client.call_tool("echo", {"text": "sneaky"})

    run(body())
    assert len(gateway.executions("echo")) == before


def test_each_session_is_a_run_and_credentials_stay_out_of_it(gateway: Gateway):
    runs = json.loads(gateway.cli("runs", "ls", "--json"))["runs"]
    assert runs
    for listed in runs:
        assert listed["labels"]["mcp.principal"] == "mcp-runner"
        # A closed session's run has ended.
        events = gateway.cli("runs", "tail", listed["run_id"], "--json", ok=(0, 4))
        assert "aaa.tool.requested" in events
        assert UPSTREAM_SECRET not in events


def test_a_grant_after_kill_9_still_runs_the_call_once(tmp_path: Path):
    gateway = Gateway(tmp_path)
    try:
        async def body():
            async with gateway.client() as client:
                call = asyncio.create_task(client.call_tool("wire_money", {"to": "RESTART", "amount": 5}))
                pending = await gateway.pending("wire_money")
                gateway.process.kill()
                gateway.process.wait()
                # The open request ends with a transport error.
                with pytest.raises(BaseException):
                    await asyncio.wait_for(call, WAIT_S)
            return pending

        pending = run(body())
        gateway.start_aaa()
        assert gateway.executions("wire_money") == []
        gateway.cli("approve", pending["run_id"], pending["call_id"])
        # The new server's worker runs it once; the run then ends (no session follows it).
        events = gateway.cli("runs", "tail", pending["run_id"], "--json", ok=(0, 4))
        assert "aaa.tool.completed" in events
        assert "sent 5 to RESTART" in events
        assert [d["arguments"] for d in gateway.executions("wire_money")] == [{"to": "RESTART", "amount": 5}]
    finally:
        gateway.stop()
