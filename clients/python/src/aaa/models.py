"""Models: what a model handler receives and the replies it returns.

A model handler is any callable (sync or async) from a ``ModelRequest`` to a
reply::

    def model(request):
        last = request.messages[-1]
        if last.role == "user":
            return tool_call("wire_money", amount=250, to="ACME")
        return text(last.content)

A reply is built with ``text(...)`` and ``tool_call(...)`` (combine them with
``+``); a handler may also return a plain ``str`` or a list of replies. The
same helpers, plus ``echo()``, are the steps of the built-in scripted model:
``client.start_run(task, model=[tool_call(...), echo()])``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from ._proto.aaa.v1 import run_pb2, types_pb2, worker_pb2
from ._tool import Tool
from .types import ErrorDetail, dumps, loads

_ROLES = {
    types_pb2.ROLE_SYSTEM: "system",
    types_pb2.ROLE_USER: "user",
    types_pb2.ROLE_ASSISTANT: "assistant",
    types_pb2.ROLE_TOOL: "tool",
}


@dataclass(frozen=True)
class ToolCall:
    """A tool call: the tool's ``name`` and its ``arguments`` object (``call_id`` is minted by the server)."""

    name: str
    arguments: dict[str, Any]
    call_id: str = ""


@dataclass(frozen=True)
class Reply:
    """A model's reply: text, tool calls, or (scripted model only) an echo of the last message."""

    content: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    echo: bool = False

    def __add__(self, other: Reply) -> Reply:
        """Merge two replies: texts are joined, tool calls concatenated."""
        if self.echo or other.echo:
            raise ValueError("echo() cannot be combined with other replies")
        content = "\n".join(c for c in (self.content, other.content) if c)
        return Reply(content, self.tool_calls + other.tool_calls)

    def to_proto(self) -> worker_pb2.ModelReply:
        """Convert to ``aaa.v1.ModelReply``."""
        if self.echo:
            raise ValueError("echo() is a step of the scripted model, not a model reply")
        return worker_pb2.ModelReply(
            content=self.content,
            tool_calls=[
                worker_pb2.ModelToolCall(name=c.name, arguments_json=dumps(c.arguments)) for c in self.tool_calls
            ],
        )

    def to_step(self) -> run_pb2.ScriptedStep:
        """Convert to a step of the scripted model (``aaa.v1.ScriptedStep``)."""
        if self.echo:
            step = run_pb2.ScriptedStep()
            step.echo.SetInParent()
            return step
        if self.tool_calls and self.content:
            raise ValueError("a scripted step is either text or tool calls, not both")
        if self.tool_calls:
            calls = [run_pb2.ScriptedToolCall(name=c.name, arguments_json=dumps(c.arguments)) for c in self.tool_calls]
            return run_pb2.ScriptedStep(tool_calls=run_pb2.ScriptedToolCalls(calls=calls))
        return run_pb2.ScriptedStep(text=self.content)


def text(content: str) -> Reply:
    """A reply with this text. A reply without tool calls ends the run with ``{"text": content}``."""
    return Reply(content=str(content))


def tool_call(tool: str | Tool, arguments: Mapping[str, Any] | None = None, /, **kwargs: Any) -> Reply:
    """A reply calling one tool: ``tool_call("wire_money", amount=250, to="ACME")``.

    ``tool`` is a tool name or a ``@tool`` function; the arguments are given
    as a mapping, as keywords, or both.
    """
    name = tool if isinstance(tool, str) else tool.name
    args = {**(arguments or {}), **kwargs}
    return Reply(tool_calls=(ToolCall(name, args),))


@dataclass(frozen=True)
class OpenAI:
    """The server's built-in OpenAI-compatible model (see docs/models.md).

    The server calls the provider itself: ``provider`` names one of its
    ``--models`` file (empty: the file's default), ``model`` what that
    provider serves (empty: the provider's ``default_model``). Keys never
    leave the server.
    """

    model: str = ""
    provider: str = ""
    temperature: float | None = None
    max_tokens: int = 0

    def to_proto(self) -> run_pb2.OpenAiModel:
        """Convert to ``aaa.v1.OpenAiModel``."""
        msg = run_pb2.OpenAiModel(model=self.model, provider=self.provider, max_tokens=self.max_tokens)
        if self.temperature is not None:
            msg.temperature = self.temperature
        return msg


def openai(
    model: str = "", *, provider: str = "", temperature: float | None = None, max_tokens: int = 0
) -> OpenAI:
    """The built-in model for ``start_run``: ``model=aaa.openai("gpt-4.1-mini", provider="openai")``."""
    return OpenAI(model=model, provider=provider, temperature=temperature, max_tokens=max_tokens)


def echo() -> Reply:
    """A scripted-model step that replies with the content of the conversation's last message."""
    return Reply(echo=True)


def as_reply(value: Any) -> Reply:
    """Normalize what a model handler returned: a Reply, a str, or a list of those."""
    if isinstance(value, Reply):
        return value
    if isinstance(value, str):
        return text(value)
    if isinstance(value, (list, tuple)) and value:
        replies = [as_reply(v) for v in value]
        merged = replies[0]
        for r in replies[1:]:
            merged = merged + r
        return merged
    raise TypeError(f"a model handler must return text(...), tool_call(...), a str or a list of them, not {value!r}")


@dataclass(frozen=True)
class Message:
    """One message of the conversation given to a model.

    Attributes:
        role: "system", "user", "assistant" or "tool".
        content: the text. For a tool message: the tool's output (a JSON
            string output unquoted, anything else as JSON text), or
            "Type: message" when the call failed.
        tool_calls: for assistant messages, the calls the model asked for.
        call_id: for tool messages, the call answered.
        name: for tool messages, the tool's name.
        error: for tool messages of failed calls (ApprovalDenied included).
    """

    role: str
    content: str
    tool_calls: tuple[ToolCall, ...] = ()
    call_id: str = ""
    name: str = ""
    error: ErrorDetail | None = None

    @classmethod
    def from_proto(cls, msg: types_pb2.Message) -> Message:
        """Convert an ``aaa.v1.Message``."""
        return cls(
            role=_ROLES.get(msg.role, "unspecified"),
            content=msg.content,
            tool_calls=tuple(ToolCall(c.name, loads(c.arguments_json, {}), c.call_id) for c in msg.tool_calls),
            call_id=msg.call_id,
            name=msg.name,
            error=ErrorDetail.from_proto(msg.error) if msg.HasField("error") else None,
        )


@dataclass(frozen=True)
class ToolSpec:
    """A tool the model may call: name, description, JSON-schema ``parameters`` and whether it is gated."""

    name: str
    description: str
    parameters: dict[str, Any]
    requires_approval: bool

    @classmethod
    def from_proto(cls, msg: types_pb2.ToolDefinition) -> ToolSpec:
        """Convert an ``aaa.v1.ToolDefinition``."""
        return cls(msg.name, msg.description, loads(msg.parameters_json, {}), msg.requires_approval)


@dataclass(frozen=True)
class ModelRequest:
    """A model call to answer: the conversation so far and the tools the model may call.

    Attributes:
        model: the model name the run asked for.
        messages: the conversation, oldest first.
        tools: the tools the model may call.
        run_id, call_id, attempt: which run and call this is.
    """

    model: str
    messages: Sequence[Message]
    tools: Sequence[ToolSpec] = field(default_factory=tuple)
    run_id: str = ""
    call_id: str = ""
    attempt: int = 1

    @classmethod
    def from_task(cls, task: worker_pb2.Task) -> ModelRequest:
        """Build the request from a model task."""
        return cls(
            model=task.model.model,
            messages=tuple(Message.from_proto(m) for m in task.model.messages),
            tools=tuple(ToolSpec.from_proto(t) for t in task.model.tools),
            run_id=task.run_id,
            call_id=task.call_id,
            attempt=task.attempt,
        )
