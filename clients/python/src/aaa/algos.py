"""In-process-style names for what a run does: ``ToolLoop(registry)``, the server's tool loop.

The loop itself runs on the server (model call, gated tool calls, approvals, retries); a
``ToolLoop`` only says which tools a run may call and, optionally, which model it uses.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable

from ._tool import Tool, ToolRegistry

__all__ = ["ToolLoop"]


class ToolLoop:
    """The server's tool loop over a registry's tools: ``await engine.start(ToolLoop(registry), {"task": ...})``.

    Args:
        registry: the tools the run may call (a ``ToolRegistry`` or a list of tools); each
            tool's ``requires_approval`` gates its calls in the run.
        model: the served model the run uses; by default the one the engine's attached
            ``LLMHandler`` serves.
    """

    def __init__(
        self, registry: ToolRegistry | Iterable[Tool | Callable[..., Any]] = (), *, model: str | None = None
    ) -> None:
        self.registry = registry if isinstance(registry, ToolRegistry) else ToolRegistry(registry)
        if model is not None and (not isinstance(model, str) or not model):
            raise ValueError(f"ToolLoop(model=...) is a model name (a non-empty str), not {model!r}")
        self.model = model

    def __repr__(self) -> str:
        return f"ToolLoop({self.registry.names}, model={self.model!r})"
