"""In-process-style names for models: ``LLMHandler(client).attach(engine)`` serves an LLM
client's answers to the engine's runs, as a worker of the engine's connection.

An LLM client is any object with ``complete(request) -> reply`` (sync or async) and,
optionally, a ``model`` name; ``FakeLLMClient(fn)`` is one, and a plain function
``fn(request) -> reply`` works too. ``request`` is an ``aaa.ModelRequest`` and the replies are
the SDK's ``text(...)`` and ``tool_call(...)`` (also as ``aaa.llm.fake.text`` / ``.tool_call``).
"""

from __future__ import annotations

from typing import Any, Callable

from ..models import ModelRequest, Reply, text, tool_call
from ..runtime import Engine
from ..worker import Worker
from . import fake
from .fake import FakeLLMClient

__all__ = ["FakeLLMClient", "LLMHandler", "ModelRequest", "Reply", "fake", "text", "tool_call"]


class LLMHandler:
    """Serves an LLM client as a model of the server's runs: ``LLMHandler(client).attach(engine)``.

    Args:
        client: an object with ``complete(request)`` (sync or async), or a function ``fn(request)``.
        model: the name the model is served under; defaults to ``client.model``, else "llm".
            Runs are sent to any worker serving that name, in any process: give different
            models different names.
        identity, concurrency, stop_grace_s: as ``aaa.Worker``.
    """

    def __init__(
        self,
        client: Any,
        *,
        model: str | None = None,
        identity: str | None = None,
        concurrency: int = 10,
        stop_grace_s: float | None = 30.0,
    ) -> None:
        complete = getattr(client, "complete", None)
        if callable(complete):
            self.complete: Callable[[ModelRequest], Any] = complete
        elif callable(client):
            self.complete = client
        else:
            raise TypeError(f"LLMHandler needs an LLM client with complete(request), or a function, not {client!r}")
        self.client = client
        self.model = model or getattr(client, "model", None) or "llm"
        if not isinstance(self.model, str):
            raise TypeError(f"a model name is a str, not {self.model!r}")
        self._options: dict[str, Any] = dict(identity=identity, concurrency=concurrency, stop_grace_s=stop_grace_s)

    def attach(self, engine: Engine) -> Worker:
        """Serve the model, as a worker of the engine's connection, until the engine closes."""
        return engine.serve(engine.client.worker(models={self.model: self.complete}, **self._options))
