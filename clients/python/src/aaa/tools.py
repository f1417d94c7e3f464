"""Declaring tools: the ``@tool`` decorator and JSON schemas from type hints.

::

    @aaa.tool(requires_approval=True)
    def wire_money(amount: int, to: str) -> str:
        \"\"\"Send money.

        Args:
            amount: whole dollars.
            to: the payee.
        \"\"\"

The tool's name is the function's name, its description the docstring's text
before the ``Args:`` section, and its parameters schema comes from the type
hints (``int`` -> integer, ``list[str]`` -> array of strings, ``Optional[X]``,
``Literal[...]``, enums, dicts...) with the per-argument docs of the
docstring. Functions may be sync (run in a thread) or async. A decorated
function stays callable as before.

``ToolRegistry`` and ``ToolHandler`` are the in-process-style names over the
worker (see ``aaa.runtime``): ``ToolHandler(ToolRegistry([wire_money])).attach(engine)``
serves the tools for as long as the engine is open.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ._tool import Tool, ToolRegistry, json_schema, parameters_schema, parse_docstring, tool
from .runtime import Engine
from .worker import Worker

__all__ = ["Tool", "ToolHandler", "ToolRegistry", "json_schema", "parameters_schema", "parse_docstring", "tool"]


class ToolHandler:
    """Serves a registry's tools to the server's runs: ``ToolHandler(registry).attach(engine)``.

    Args:
        registry: the tools (a ``ToolRegistry``, or a list of tools).
        identity, concurrency, stop_grace_s: as ``aaa.Worker``.
    """

    def __init__(
        self,
        registry: ToolRegistry | Iterable[Tool | Callable[..., Any]],
        *,
        identity: str | None = None,
        concurrency: int = 10,
        stop_grace_s: float | None = 30.0,
    ) -> None:
        self.registry = registry if isinstance(registry, ToolRegistry) else ToolRegistry(registry)
        if not self.registry.tools:
            raise ValueError("a ToolHandler needs at least one tool to serve")
        self._options: dict[str, Any] = dict(identity=identity, concurrency=concurrency, stop_grace_s=stop_grace_s)

    def attach(self, engine: Engine) -> Worker:
        """Register the tools and serve them, as a worker of the engine's connection, until the engine closes."""
        return engine.serve(engine.client.worker(tools=self.registry.tools, **self._options))
