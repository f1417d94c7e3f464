"""Approver groups and the approval policy: a server with an auth config whose principals have
groups, and a policy file (``--policy``). A tool's ``approvers`` decide who may decide its calls;
a policy rule may grant a call itself (actor kind "policy"); the policy can be read and reloaded."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

import aaa
from aaa import echo, tool, tool_call

from conftest import Server, start_server, stop_process
from helpers import WAIT_S, collect, next_item, of_type

# Tool names are fixed: the policy file names them.
POLICY = """
[[rule]]
name = "small-refunds"
when = 'tool == "refund" && args.amount < 100'
decide = "allow"
"""

# (name, roles, groups): admin serves the tools and starts the runs; alice is a finance approver,
# carol an approver in no group.
PRINCIPALS = [
    ("admin", ["admin"], []),
    ("alice", ["approver"], ["finance"]),
    ("carol", ["approver"], []),
]


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f'"{item}"' for item in items) + "]"


def start_policy_server(root: Path) -> Server:
    """A server with auth (token NAME-token for each principal) and root/policy.toml."""
    auth = "".join(
        f'[[principal]]\nname = "{name}"\nroles = {_toml_list(roles)}\ngroups = {_toml_list(groups)}\n'
        f'token_sha256 = "{_sha256(name + "-token")}"\n\n'
        for name, roles, groups in PRINCIPALS
    )
    (root / "auth.toml").write_text(auth)
    (root / "policy.toml").write_text(POLICY)
    args = ("--auth-config", str(root / "auth.toml"), "--policy", str(root / "policy.toml"))
    return start_server(root / "data", root / "server.log", extra_args=args)


@pytest.fixture(scope="module")
def policy_server(tmp_path_factory: pytest.TempPathFactory):
    srv = start_policy_server(tmp_path_factory.mktemp("policy"))
    yield srv
    stop_process(srv.process)


async def connect_as(server: Server, name: str) -> aaa.Client:
    return await aaa.connect(server.address, token=f"{name}-token")


@tool(requires_approval=True, approvers=["finance"])
def pay(amount: int) -> str:
    """Pay; only finance may decide."""
    return f"paid {amount}"


@tool(requires_approval=True)
def lookup(key: str) -> str:
    """Read a key; any approver may decide."""
    return f"value of {key}"


@tool(requires_approval=True)
def refund(amount: int) -> str:
    """Refund; the policy allows small ones."""
    return f"refunded {amount}"


def test_approvers_go_into_the_definition():
    assert pay.approvers == ["finance"] and list(pay.definition().approvers) == ["finance"]
    assert list(lookup.definition().approvers) == []
    with pytest.raises(TypeError):
        tool(approvers="finance")(lambda: None)


async def test_only_the_approver_groups_of_a_tool_decide_its_calls(policy_server, uid):
    labels = {"test": uid}
    admin, alice, carol = [await connect_as(policy_server, name) for name in ("admin", "alice", "carol")]
    try:
        async with admin.worker(tools=[pay, lookup]):
            paying = await admin.start_run("pay", model=[tool_call(pay, amount=5), echo()], tools=[pay], labels=labels)
            looking = await admin.start_run(
                "look", model=[tool_call(lookup, key="motd"), echo()], tools=[lookup], labels=labels
            )
            for run in (paying, looking):
                await run.wait_for("aaa.approval.requested")

            # Everyone sees both; decidable=True keeps those the caller may decide.
            shown = {a.tool: a for a in await carol.approvals.list(labels=labels)}
            assert (shown["pay"].approvers, shown["lookup"].approvers) == (["finance"], [])
            assert [a.tool for a in await carol.approvals.list(labels=labels, decidable=True)] == ["lookup"]
            assert sorted(a.tool for a in await alice.approvals.list(labels=labels, decidable=True)) == [
                "lookup",
                "pay",
            ]
            watch = carol.approvals.watch(labels=labels, decidable=True)
            try:
                first = await next_item(watch)
                assert isinstance(first, aaa.Approval) and first.tool == "lookup"
                snapshot = await next_item(watch)
                assert isinstance(snapshot, aaa.SnapshotComplete) and snapshot.pending == 1
            finally:
                await watch.aclose()

            # Carol is not in finance: refused, alone or in a batch.
            payment = shown["pay"]
            with pytest.raises(aaa.NotAnApproverForCall) as refused:
                await carol.run(paying.id).approve(payment.call_id, arguments_sha256=payment.arguments_sha256)
            assert isinstance(refused.value, aaa.PermissionDenied)
            assert refused.value.reason == "NOT_AN_APPROVER_FOR_CALL"
            assert refused.value.groups == ["finance"] and refused.value.metadata["call_id"] == payment.call_id
            with pytest.raises(aaa.NotAnApproverForCall):
                await carol.run(paying.id).edit(payment.call_id, {"amount": 4})
            [result] = await carol.decide_approvals([payment])
            assert (result.status, result.error_reason) == (aaa.DecisionStatus.REFUSED, "NOT_AN_APPROVER_FOR_CALL")

            # Alice is: her grant runs the call; carol may grant the call that names no group.
            granted = await alice.run(paying.id).approve(payment.call_id, arguments_sha256=payment.arguments_sha256)
            assert (granted.decision, granted.already_decided) == ("aaa.approval.granted", False)
            await carol.run(looking.id).approve(shown["lookup"].call_id)
            assert (await paying.result(timeout=WAIT_S)).value == {"text": "paid 5"}
            assert (await looking.result(timeout=WAIT_S)).value == {"text": "value of motd"}
    finally:
        for client in (admin, alice, carol):
            await client.close()


async def test_a_policy_rule_grants_a_call(policy_server):
    async with await connect_as(policy_server, "admin") as admin:
        async with admin.worker(tools=[refund]):
            run = await admin.start_run("refund", model=[tool_call(refund, amount=50), echo()], tools=[refund])
            outcome = await run.result(timeout=WAIT_S)
        assert outcome.value == {"text": "refunded 50"}
        events = await collect(run)
        assert of_type(events, "aaa.approval.requested") == []
        [granted] = of_type(events, "aaa.approval.granted")
        assert granted.actor == aaa.Actor(kind="policy", name="small-refunds")
        assert granted.data["policy"] == {"rule": "small-refunds", "sha256": _sha256(POLICY)}


async def test_get_and_reload_the_policy(tmp_path):
    server = start_policy_server(tmp_path)
    file = tmp_path / "policy.toml"
    try:
        async with await connect_as(server, "admin") as admin, await connect_as(server, "carol") as carol:
            policy = await carol.get_policy()
            assert policy == aaa.Policy(loaded=True, sha256=_sha256(POLICY), rules=["small-refunds"], file=str(file))
            with pytest.raises(aaa.PermissionDenied):
                await carol.reload_policy()

            # A file that does not check is refused; the policy in force stays.
            file.write_text("[[rule]]\nname = \"r\"\nwhen = 'amount > 1'\ndecide = \"allow\"\n")
            with pytest.raises(aaa.InvalidField) as refused:
                await admin.reload_policy()
            assert "rule 1 ('r')" in refused.value.message
            assert (await carol.get_policy()).sha256 == policy.sha256

            changed = "[[rule]]\nname = \"refunds\"\nwhen = 'tool == \"refund\"'\ndecide = \"allow\"\n"
            file.write_text(changed)
            reloaded = await admin.reload_policy()
            assert (reloaded.loaded, reloaded.sha256, reloaded.rules) == (True, _sha256(changed), ["refunds"])
            assert await carol.get_policy() == reloaded
    finally:
        stop_process(server.process)


async def test_a_server_without_a_policy(client):
    assert await client.get_policy() == aaa.Policy(loaded=False)
    with pytest.raises(aaa.InvalidField):
        await client.reload_policy()
