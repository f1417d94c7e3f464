"""A fake LLM client for tests and examples: a plain function plays the model.

::

    def llm(request):
        last = request.messages[-1]          # .role: "user", "assistant" or "tool"; .content
        if last.role == "user":
            return fake.tool_call("wire_money", amount=250, to="ACME")
        return fake.text(last.content)       # a tool's output, or its error ("ApprovalDenied: ...")

    LLMHandler(FakeLLMClient(llm)).attach(engine)

``text`` and ``tool_call`` are the SDK's replies (``aaa.text``, ``aaa.tool_call``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..models import ModelRequest, Reply, text, tool_call

__all__ = ["FakeLLMClient", "text", "tool_call"]


class FakeLLMClient:
    """An LLM client whose answers come from ``fn(request)`` (sync or async).

    ``request`` is an ``aaa.ModelRequest``: ``request.messages`` (each with ``.role`` and
    ``.content``) and ``request.tools``. ``fn`` returns ``text(...)``, ``tool_call(...)``,
    their sum, or a str. ``model`` is the name the model is served under.
    """

    def __init__(self, fn: Callable[[ModelRequest], Any], *, model: str = "fake") -> None:
        if not callable(fn):
            raise TypeError(f"FakeLLMClient wraps a function fn(request) -> reply, not {fn!r}")
        self.fn = fn
        self.model = model

    def complete(self, request: ModelRequest) -> Reply | Any:
        """One answer of the model. Plain call: the worker runs it in its thread pool and awaits
        the coroutine an async ``fn`` returns, so neither kind blocks the event loop."""
        return self.fn(request)

    def __repr__(self) -> str:
        return f"FakeLLMClient({self.fn!r}, model={self.model!r})"
