"""The @tool decorator, schemas from type hints and docstrings, and reply helpers (no server)."""

from __future__ import annotations

import enum
import json
from typing import Literal, Optional

import pytest

import aaa
from aaa import echo, text, tool, tool_call
from aaa.models import as_reply


class Color(enum.Enum):
    RED = "red"
    BLUE = "blue"


@tool(requires_approval=True, retries=2, retry_backoff_s=0.5, heartbeat_timeout_s=5)
def transfer(amount: int, to: str, memo: Optional[str] = None, tags: list[str] = [], color: Color = Color.RED) -> str:
    """Send money to a payee.

    More details for humans.

    Args:
        amount: whole dollars,
            never negative.
        to: the payee.
        memo: a note.

    Returns:
        a receipt.
    """
    return f"{amount}->{to}"


def test_schema_from_hints_and_docstring():
    assert transfer.name == "transfer"
    assert transfer.description == "Send money to a payee.\n\nMore details for humans."
    assert transfer.parameters == {
        "type": "object",
        "properties": {
            "amount": {"type": "integer", "description": "whole dollars, never negative."},
            "to": {"type": "string", "description": "the payee."},
            "memo": {"anyOf": [{"type": "string"}, {"type": "null"}], "description": "a note.", "default": None},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "color": {"enum": ["red", "blue"]},
        },
        "required": ["amount", "to"],
    }


def test_definition_and_direct_call():
    d = transfer.definition()
    assert d.name == "transfer" and d.requires_approval
    assert d.retry.max_attempts == 3 and d.retry.initial_backoff_s == 0.5
    assert d.heartbeat_timeout_s == 5
    assert json.loads(d.parameters_json) == transfer.parameters
    assert transfer(250, "ACME") == "250->ACME"


def test_plain_decorator_async_and_literal():
    @tool
    async def pick(mode: Literal["a", "b"], n: float = 1.5, extra: dict[str, int] | None = None) -> None:
        """:param mode: which one"""

    assert isinstance(pick, aaa.Tool) and not pick.requires_approval
    assert pick.parameters["properties"]["mode"] == {"enum": ["a", "b"], "description": "which one"}
    assert pick.parameters["properties"]["n"] == {"type": "number", "default": 1.5}
    extra = pick.parameters["properties"]["extra"]
    assert extra["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "integer"}}
    assert pick.parameters["required"] == ["mode"]
    assert not pick.definition().HasField("retry")


def test_replies_and_scripted_steps():
    assert tool_call(transfer, amount=250, to="ACME").tool_calls[0].arguments == {"amount": 250, "to": "ACME"}
    reply = text("paying") + tool_call("transfer", {"amount": 2**63 + 1})
    proto = reply.to_proto()
    assert proto.content == "paying"
    assert proto.tool_calls[0].arguments_json == '{"amount":9223372036854775809}'
    assert as_reply("hi") == text("hi")
    assert as_reply([tool_call("a"), tool_call("b")]).tool_calls[1].name == "b"
    assert echo().to_step().HasField("echo")
    assert text("done").to_step().text == "done"
    with pytest.raises(ValueError):
        reply.to_step()
    with pytest.raises(TypeError):
        as_reply(42)


def test_the_built_in_openai_model_spec():
    spec = aaa.openai("gpt-4.1-mini", provider="openai", temperature=0.2).to_proto()
    assert (spec.model, spec.provider, spec.temperature, spec.max_tokens) == ("gpt-4.1-mini", "openai", 0.2, 0)
    assert not aaa.openai().to_proto().HasField("temperature")
    assert aaa.Budget(max_tokens=5000).to_proto().max_tokens == 5000
