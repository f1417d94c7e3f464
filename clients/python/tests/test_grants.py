"""Standing grants: a grant made in advance lets matching calls run (actor kind "grant"),
counts its uses, stops when used up or revoked, and refuses bad input by field."""

from __future__ import annotations

import pytest

import aaa

from helpers import WAIT_S, collect, of_type
from test_reviews import payment_setup, pending

async def test_a_grant_lets_matching_calls_run_until_it_is_used_up(client, uid):
    wire, model, ran, _ = payment_setup(uid)
    labels = {"test": uid}
    async with client.worker(tools=[wire], models={f"m-{uid}": model}):
        with pytest.raises(aaa.InvalidField) as err:
            await client.create_grant(wire, reason="x", condition="args.amount <")
        assert err.value.field == "condition"
        grant = await client.create_grant(
            wire,
            reason="payroll day",
            labels=labels,
            condition="args.amount < 1000",
            expires_in=3600,
            max_uses=1,
            request_id=f"grant-{uid}",
        )
        assert (grant.active, grant.uses, grant.uses_left, grant.labels) == (True, 0, 1, labels)
        assert grant.expires_at is not None

        run = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)
        await run.result(timeout=WAIT_S)
        assert ran == [(250, "ACME")]
        [granted] = of_type(await collect(run), "aaa.approval.granted")
        assert (granted.actor.kind, granted.actor.name) == ("grant", grant.id)
        assert granted.data["grant"]["reason"] == "payroll day"

        # Used up: the next call waits for a person.
        assert [g.id for g in await client.list_grants(tool=wire.name)] == []
        [used] = [g for g in await client.list_grants(include_revoked=True) if g.id == grant.id]
        assert (used.active, used.uses, used.uses_left) == (False, 1, 0)
        # Sent again with its request id (its answer lost): no second grant, the first as it is now.
        again = await client.create_grant(wire, reason="payroll day", labels=labels, max_uses=1, request_id=f"grant-{uid}")
        assert (again.id, again.uses) == (grant.id, 1)
        second = await client.start_run("Pay ACME $250", model=f"m-{uid}", tools=[wire], labels=labels)
        await pending(client, second)
        await second.cancel("done")

        revoked = await client.revoke_grant(grant.id, reason="payroll is over")
        assert (revoked.revoke_reason, revoked.revoked_at is not None) == ("payroll is over", True)
        with pytest.raises(aaa.GrantNotFound):
            await client.revoke_grant("no-such-grant", reason="x")
