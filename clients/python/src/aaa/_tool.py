"""Tools as declared: ``Tool``, the ``@tool`` decorator, JSON schemas from type hints, and
``ToolRegistry``. Public as ``aaa.tools`` (and ``aaa.tool``, ``aaa.Tool``); this module sits
beneath the client and the worker, which take tools, and ``aaa.tools`` above the ``Engine``, which
its ``ToolHandler`` serves tools to.
"""

from __future__ import annotations

import collections.abc as abc
import enum
import functools
import inspect
import re
import types
import typing
from typing import Any, Callable, Iterable, Iterator

from ._proto.aaa.v1 import types_pb2
from .types import dumps

__all__ = ["Tool", "ToolRegistry", "json_schema", "parameters_schema", "parse_docstring", "tool"]

_SECTION_RE = re.compile(r"^\s*(Args|Arguments|Parameters|Params)\s*:\s*$")
_OTHER_SECTION_RE = re.compile(r"^\s*(Returns|Return|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_RE = re.compile(r"^\s*\*{0,2}(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_RE = re.compile(r"^\s*:param\s+(?:[\w\[\], ]+\s+)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-argument docs.

    Understands Google style (an ``Args:`` section of ``name: text`` lines)
    and Sphinx style (``:param name: text``).
    """
    description: list[str] = []
    params: dict[str, str] = {}
    section = "description"
    current = None
    for line in inspect.cleandoc(doc or "").splitlines():
        sphinx = _SPHINX_RE.match(line)
        if sphinx:
            current = sphinx.group(1)
            params[current] = sphinx.group(2).strip()
            section = "args"
        elif _SECTION_RE.match(line):
            section, current = "args", None
        elif _OTHER_SECTION_RE.match(line) or line.strip().startswith(":"):
            section, current = "other", None
        elif section == "description":
            description.append(line)
        elif section == "args":
            arg = _ARG_RE.match(line)
            if arg and len(line) - len(line.lstrip()) <= 4:
                current = arg.group(1)
                params[current] = arg.group(3).strip()
            elif current and line.strip():
                params[current] = (params[current] + " " + line.strip()).strip()
    return "\n".join(description).strip(), params


def json_schema(annotation: Any) -> dict[str, Any]:
    """Return the JSON schema of a type hint ({} when it says nothing)."""
    if annotation is inspect.Parameter.empty or annotation is Any:
        return {}
    if annotation is None or annotation is type(None):
        return {"type": "null"}
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return json_schema(args[0])
    if origin is typing.Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        return {"anyOf": [json_schema(a) for a in args]}
    if origin is typing.Literal:
        return {"enum": list(args)}
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return {"enum": [m.value for m in annotation]}
    simple = {bool: "boolean", int: "integer", float: "number", str: "string"}
    if annotation in simple:
        return {"type": simple[annotation]}
    container = origin or annotation
    if container in (list, tuple, set, frozenset) or _is_abc(container, "Sequence", "Set", "Iterable"):
        item = args[0] if args and args[0] is not Ellipsis else Any
        return {"type": "array", "items": json_schema(item)} if item is not Any else {"type": "array"}
    if container is dict or _is_abc(container, "Mapping"):
        schema: dict[str, Any] = {"type": "object"}
        if len(args) == 2 and args[1] is not Any:
            schema["additionalProperties"] = json_schema(args[1])
        return schema
    return {}


def _is_abc(tp: Any, *names: str) -> bool:
    """True if ``tp`` is one of the named collections.abc classes."""
    return any(tp is getattr(abc, n) for n in names)


def parameters_schema(fn: Callable[..., Any], docs: dict[str, str] | None = None) -> dict[str, Any]:
    """Return the JSON schema of a function's keyword arguments object."""
    docs = docs or {}
    try:
        hints = typing.get_type_hints(fn, include_extras=True)
    except Exception:  # unresolvable annotations: fall back to none
        hints = {}
    properties: dict[str, Any] = {}
    required: list[str] = []
    for name, param in inspect.signature(fn).parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD, param.POSITIONAL_ONLY):
            continue
        prop = json_schema(hints.get(name, param.annotation))
        if name in docs:
            prop["description"] = docs[name]
        if param.default is param.empty:
            required.append(name)
        else:
            try:
                dumps(param.default)
                prop["default"] = param.default
            except (TypeError, ValueError):
                pass
        properties[name] = prop
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    return schema


class Tool:
    """A function served as an aaa tool. Create it with ``@tool``.

    Attributes:
        fn: the wrapped function (sync or async).
        name: the registered tool name.
        description: what the tool does, shown to models.
        parameters: JSON schema of its arguments object.
        requires_approval: every call waits for a human grant.
        retries: retries after a failed or lost first attempt (None: server default).
        retry_backoff_s: delay before the first retry (None: server default, 1 s).
        heartbeat_timeout_s: an attempt without heartbeat for this long is lost (None: server default).
        approval_timeout_s: an unanswered approval request is denied after this long (None: never).
        approvals_required: grants from distinct approvers a gated call needs (None: one).
        approvers: the approver groups whose members may decide its calls (empty: any approver).
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str | None = None,
        description: str | None = None,
        requires_approval: bool = False,
        retries: int | None = None,
        retry_backoff_s: float | None = None,
        heartbeat_timeout_s: float | None = None,
        approval_timeout_s: float | None = None,
        approvals_required: int | None = None,
        approvers: Iterable[str] = (),
    ) -> None:
        summary, docs = parse_docstring(fn.__doc__ or "")
        self.fn = fn
        self.name = name or fn.__name__
        self.description = summary if description is None else description
        self.parameters = parameters_schema(fn, docs)
        self.requires_approval = requires_approval
        self.retries = retries
        self.retry_backoff_s = retry_backoff_s
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.approval_timeout_s = approval_timeout_s
        self.approvals_required = approvals_required
        if isinstance(approvers, str):  # a lone name would be taken letter by letter
            raise TypeError(f"approvers takes a list of group names, e.g. [{approvers!r}]")
        self.approvers = list(approvers)
        functools.update_wrapper(self, fn)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Call the wrapped function directly."""
        return self.fn(*args, **kwargs)

    def __repr__(self) -> str:
        return f"Tool({self.name!r}, requires_approval={self.requires_approval})"

    def definition(self) -> types_pb2.ToolDefinition:
        """The ``aaa.v1.ToolDefinition`` a worker registers for this tool."""
        msg = types_pb2.ToolDefinition(
            name=self.name,
            description=self.description,
            parameters_json=dumps(self.parameters),
            requires_approval=self.requires_approval,
            heartbeat_timeout_s=self.heartbeat_timeout_s or 0.0,
            approval_timeout_s=self.approval_timeout_s or 0.0,
            approvals_required=self.approvals_required or 0,
            approvers=self.approvers,
        )
        if self.retries is not None or self.retry_backoff_s is not None:
            msg.retry.max_attempts = self.retries + 1 if self.retries is not None else 0
            msg.retry.initial_backoff_s = self.retry_backoff_s or 0.0
        return msg


def tool(
    fn: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    retries: int | None = None,
    retry_backoff_s: float | None = None,
    heartbeat_timeout_s: float | None = None,
    approval_timeout_s: float | None = None,
    approvals_required: int | None = None,
    approvers: Iterable[str] = (),
) -> Any:
    """Declare a function as a tool; use as ``@tool`` or ``@tool(requires_approval=True, ...)``.

    Args:
        fn: the function (when used without parentheses).
        name: tool name; defaults to the function's name.
        description: defaults to the docstring's description.
        requires_approval: every call waits for an ``aaa.approval.granted``.
        retries: retries after the first attempt fails or is lost
            (0: none). Default: the server's (none for gated tools, 2 otherwise).
        retry_backoff_s: delay before the first retry (doubles after each).
        heartbeat_timeout_s: how long an attempt may go without a heartbeat;
            the worker sends them for you at a third of this.
        approval_timeout_s: deny unanswered approval requests after this long.
        approvals_required: with ``requires_approval``, a call runs only after this many
            grants from distinct approvers (at most 16); any one denial denies.
        approvers: the approver groups (``groups`` of the server's auth config) whose members
            may decide its calls that wait for a decision; others get ``NotAnApproverForCall``.
            Empty: any approver (a policy rule may still name groups). Not enforced when the
            server runs without auth.
    """
    options: dict[str, Any] = dict(
        name=name,
        description=description,
        requires_approval=requires_approval,
        retries=retries,
        retry_backoff_s=retry_backoff_s,
        heartbeat_timeout_s=heartbeat_timeout_s,
        approval_timeout_s=approval_timeout_s,
        approvals_required=approvals_required,
        approvers=approvers,
    )
    if fn is None:
        return lambda f: Tool(f, **options)
    return Tool(fn, **options)


class ToolRegistry:
    """The tools a program offers: ``ToolRegistry([wire_money, lookup, ...])``.

    Items are ``@tool`` functions or plain functions (declared as ``tool(fn)``, ungated).
    Names must be unique. ``ToolHandler(registry)`` serves them; ``ToolLoop(registry)``
    lets a run call them.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] = ()) -> None:
        if callable(tools) or isinstance(tools, str):
            raise TypeError(f"ToolRegistry takes a list of tools, e.g. ToolRegistry([fn]), not {tools!r}")
        self._tools: dict[str, Tool] = {}
        for item in tools:
            self.add(item)

    def add(self, item: Tool | Callable[..., Any]) -> Tool:
        """Add a tool (a plain function is declared with ``tool(fn)``); returns it."""
        if not isinstance(item, Tool):
            if not callable(item):
                raise TypeError(f"a ToolRegistry holds @tool functions or functions, not {item!r}")
            item = Tool(item)
        if item.name in self._tools:
            raise ValueError(f"the registry has a tool named {item.name!r} already")
        self._tools[item.name] = item
        return item

    @property
    def tools(self) -> list[Tool]:
        """The tools, in the order they were added."""
        return list(self._tools.values())

    @property
    def names(self) -> list[str]:
        """The tools' names, in the order they were added."""
        return list(self._tools)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __iter__(self) -> Iterator[Tool]:
        return iter(self.tools)

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names})"
