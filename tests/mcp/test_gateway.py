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
# @modelcontextprotocol/server-everything, installed by `npm ci` in tests/mcp/ts (run.sh).
EVERYTHING = Path(__file__).parent / "ts" / "node_modules" / "@modelcontextprotocol" / "server-everything" / "dist" / "index.js"
TOKENS = {"runner": "mcp-runner-token", "approver": "alice-token", "reader": "reader-token",
          "other_runner": "other-runner-token"}
# An upstream credential: it must never show in aaa's log, events or errors.
UPSTREAM_SECRET = "upstream-secret-5f1d2c"
WAIT_S = 20.0
EXPOSED = ["bank_refuse", "echo", "everything_echo", "everything_sum", "http_echo", "wire_money", "wire_money_soon"]


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

[[principal]]
name = "other-runner"
roles = ["runner"]
token_sha256 = "{sha256(TOKENS['other_runner'])}"
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

[[upstream]]
name = "everything"
command = "node"
args = [{json.dumps(str(EVERYTHING))}, "stdio"]

[[upstream.tool]]
name = "echo"
expose_as = "everything_echo"

[[upstream.tool]]
name = "get-sum"
expose_as = "everything_sum"
requires_approval = true
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

    async def pending_of(self, tool: str, arguments: dict) -> dict:
        """The pending approval of `tool` with `arguments`."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            listed = json.loads(self.cli("approvals", "ls", "--json"))["approvals"]
            found = [a for a in listed if a["tool"] == tool and a["arguments"] == arguments]
            if found:
                return found[0]
            await asyncio.sleep(0.05)
        pytest.fail(f"no pending approval of {tool} {arguments} within {WAIT_S}s")

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
            assert sorted(tools) == EXPOSED
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


def test_server_everything_behind_aaa(gateway: Gateway):
    """@modelcontextprotocol/server-everything over stdio: its `echo`
    ungated, its `get-sum` gated and granted with `aaa approve`."""
    async def body():
        async with gateway.client() as client:
            tools = {t.name: t for t in (await client.list_tools()).tools}
            assert tools["everything_sum"].input_schema["properties"]["a"]["type"] == "number"
            echoed = await client.call_tool("everything_echo", {"message": "from python"})
            assert not echoed.is_error, echoed
            assert echoed.content[0].text == "Echo: from python"
            call = asyncio.create_task(client.call_tool("everything_sum", {"a": 19, "b": 23}))
            pending = await gateway.pending("everything_sum")
            assert pending["arguments"] == {"a": 19, "b": 23}
            assert not call.done()
            gateway.cli("approve", pending["run_id"], pending["call_id"])
            result = await call
        assert not result.is_error, result
        assert result.content[0].text == "The sum of 19 and 23 is 42."
        assert result.meta["aaa/call_id"] == pending["call_id"]

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
            assert tools == EXPOSED
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


def test_an_unanswered_approval_expires_as_a_tool_error(gateway: Gateway):
    async def body():
        before = len(gateway.executions("wire_money"))
        async with gateway.client() as client:
            # Nobody answers: the request expires after its tool's 1 s (the
            # engine records a denial with the reason `timeout`); the model
            # reads an expiry, not a person's refusal.
            result = await client.call_tool("wire_money_soon", {"to": "LATE", "amount": 3})
            assert result.is_error
            assert result.content[0].text == (
                "the approval request expired: nobody decided within the approval "
                "timeout of 1 s (expiry reason: timeout); the call was not run")
            assert result.meta["aaa/error_type"] == "ApprovalExpired"
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


class TasksSession:
    """A raw MCP session (2025-11-25, Streamable HTTP) whose client declares
    the tasks extension (io.modelcontextprotocol/tasks, SEP-2663), which
    neither official SDK speaks yet: JSON-RPC over httpx2."""

    def __init__(self, url: str, token: str):
        self.url = url
        self.http = httpx2.Client(timeout=30, headers={
            "Authorization": f"Bearer {token}", "Accept": "application/json, text/event-stream"})
        self.session: str | None = None
        self.last_id = 0
        self.request("initialize", {
            "protocolVersion": "2025-11-25",
            "capabilities": {"extensions": {"io.modelcontextprotocol/tasks": {}}},
            "clientInfo": {"name": "tasks-client", "version": "1"}})
        self.post({"jsonrpc": "2.0", "method": "notifications/initialized"})

    def post(self, message: dict) -> httpx2.Response:
        headers = {"Mcp-Session-Id": self.session, "MCP-Protocol-Version": "2025-11-25"} if self.session else {}
        answer = self.http.post(self.url, json=message, headers=headers)
        assert answer.status_code in (200, 202), f"{answer.status_code}: {answer.text}"
        self.session = answer.headers.get("mcp-session-id", self.session)
        return answer

    def request(self, method: str, params: dict) -> dict:
        """The JSON-RPC answer (result or error) to one request."""
        self.last_id += 1
        answer = self.post({"jsonrpc": "2.0", "id": self.last_id, "method": method, "params": params})
        if answer.headers["content-type"].startswith("application/json"):
            return answer.json()
        for line in answer.text.splitlines():
            if line.startswith("data:") and line[5:].strip():
                message = json.loads(line[5:])
                if message.get("id") == self.last_id:
                    return message
        pytest.fail(f"no answer to {method}: {answer.text}")

    def task(self, task_id: str) -> dict:
        answer = self.request("tasks/get", {"taskId": task_id})
        assert "result" in answer, answer
        return answer["result"]

    def close(self) -> None:
        self.http.close()


def test_a_task_client_gets_the_result_after_kill_9(tmp_path: Path):
    """kill -9 of aaa while gated calls wait: one from the Python SDK (no
    tasks), one from a client that declared the tasks extension. After the
    restart on the same store, `aaa approve` runs each once with its exact
    arguments; the task client, in a new session, gets the upstream's
    result with tasks/get; the SDK client's open request failed, and its
    call's result is in the run (`aaa runs tail`)."""
    gateway = Gateway(tmp_path)
    try:
        # The task client: a call that waits for a person is answered at once with its task.
        tasks = TasksSession(gateway.url, TOKENS["runner"])
        created = tasks.request("tools/call", {"name": "wire_money", "arguments": {"to": "TASK", "amount": 6}})
        assert created["result"]["resultType"] == "task", created
        task_id = created["result"]["taskId"]
        assert created["result"]["status"] == "working"
        assert "waits for approval" in created["result"]["statusMessage"]
        assert tasks.task(task_id)["status"] == "working"
        by_task = json.loads(gateway.cli("approvals", "ls", "--json"))["approvals"][0]
        assert task_id == f"aaa-call:{by_task['run_id']}:{by_task['call_id']}"
        assert tasks.request("tasks/get", {"taskId": "aaa-call:nope:call-1"})["error"]["code"] == -32602

        async def body():
            async with gateway.client() as client:
                call = asyncio.create_task(client.call_tool("wire_money", {"to": "RESTART", "amount": 5}))
                pending = await gateway.pending_of("wire_money", {"to": "RESTART", "amount": 5})
                gateway.process.kill()
                gateway.process.wait()
                # The open request ends with a transport error.
                with pytest.raises(BaseException):
                    await asyncio.wait_for(call, WAIT_S)
            return pending

        pending = run(body())
        tasks.close()
        gateway.start_aaa()
        assert gateway.executions("wire_money") == []
        # A new session of the task client: the task is still there, still waiting.
        tasks = TasksSession(gateway.url, TOKENS["runner"])
        assert tasks.task(task_id)["status"] == "working"
        gateway.cli("approve", by_task["run_id"], by_task["call_id"])
        gateway.cli("approve", pending["run_id"], pending["call_id"])
        deadline = time.monotonic() + WAIT_S
        while (state := tasks.task(task_id))["status"] == "working" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state["status"] == "completed", state
        assert state["result"]["content"][0]["text"] == "sent 6 to TASK"
        assert state["result"].get("isError") in (None, False)
        assert state["result"]["_meta"]["aaa/call_id"] == by_task["call_id"]
        tasks.close()
        # The SDK client's call ran too; its result is in its run.
        events = gateway.cli("runs", "tail", pending["run_id"], "--json", ok=(0, 4))
        assert "aaa.tool.completed" in events
        assert "sent 5 to RESTART" in events
        done = sorted((d["arguments"]["to"], d["arguments"]["amount"]) for d in gateway.executions("wire_money"))
        assert done == [("RESTART", 5), ("TASK", 6)]
    finally:
        gateway.stop()


def test_a_denied_task_completes_with_the_reason(gateway: Gateway):
    tasks = TasksSession(gateway.url, TOKENS["runner"])
    try:
        created = tasks.request("tools/call", {"name": "wire_money", "arguments": {"to": "TASKDENY", "amount": 1}})
        task_id = created["result"]["taskId"]
        pending = asyncio.run(gateway.pending("wire_money"))
        gateway.cli("deny", pending["run_id"], pending["call_id"], "--reason", "no tasks today")
        deadline = time.monotonic() + WAIT_S
        while (state := tasks.task(task_id))["status"] == "working" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert state["status"] == "completed", state
        assert state["result"]["isError"] is True
        assert "no tasks today" in state["result"]["content"][0]["text"]
        # Another runner cannot read the task: the same answer as for no
        # task at all.
        other = TasksSession(gateway.url, TOKENS["other_runner"])
        try:
            refused = other.request("tasks/get", {"taskId": task_id})
            assert refused["error"]["code"] == -32602, refused
            assert refused["error"]["message"] == f"no task '{task_id}'"
        finally:
            other.close()
        # An ungated call of a task client is answered at once, no task.
        echoed = tasks.request("tools/call", {"name": "echo", "arguments": {"text": "no task"}})
        assert echoed["result"]["content"][0]["text"] == "echo: no task", echoed
    finally:
        tasks.close()
