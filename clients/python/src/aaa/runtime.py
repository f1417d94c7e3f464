"""In-process-style names over the SDK: the ``Engine`` a program opens, starts runs on, and
attaches handlers and subscriptions to.

::

    async with Engine() as engine:                 # aaa.connect(): env AAA_SERVER or 127.0.0.1:50051
        LLMHandler(FakeLLMClient(llm)).attach(engine)
        ToolHandler(registry).attach(engine)
        run = await engine.start(ToolLoop(registry), {"task": "Pay ACME $250", "budget": Budget(deadline_s=60)})
        events = await engine.store.read(run.run_id)
        outcome = await run.result()

The engine is one ``aaa.Client``; handlers are ``aaa.Worker``s of it, subscriptions are
``Client.subscribe`` tasks, ``start`` is ``Client.start_run`` and returns the SDK's ``aaa.Run``.
Everything runs on the server: the runs, their approvals and their events outlive the program.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, Awaitable, Callable, Mapping, Sequence, Union

import grpc

from .algos import ToolLoop
from .client import Client, Run, connect
from .subscriptions import Delivery
from .types import Budget, Event, Outcome
from .worker import Worker

__all__ = ["Budget", "Engine", "EventStore", "Outcome"]

log = logging.getLogger("aaa.runtime")

#: What ``engine.start`` reads from its input; anything else is refused so typos do not pass silently.
_START_KEYS = frozenset({"task", "budget", "labels", "system", "request_id"})

_NOT_OPEN = "the Engine is not open: use `async with Engine() as engine:`"

EventHandler = Callable[[Event], Union[Awaitable[None], None]]


class EventStore:
    """The server's event log, as ``engine.store``."""

    def __init__(self, client: Client) -> None:
        self._client = client

    async def read(self, run_id: str, after_seq: int = 0) -> list[Event]:
        """The run's events with seq above ``after_seq``, oldest first, as stored now.

        Each ``Event`` has ``.type``, ``.data`` (a dict; numbers exact), ``.seq`` and ``.run_id``.
        Raises ``aaa.RunNotFound`` for an unknown run.
        """
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"store.read needs a run id (a non-empty str), not {run_id!r}")
        stream = self._client.run(run_id).events(after_seq, follow=False)
        try:
            return [event async for event in stream]
        finally:
            await stream.aclose()


class Engine:
    """A connection to an aaa server, opened with ``async with Engine() as engine:``.

    Args:
        address: "host:port" (or a list, for a cluster); defaults to env AAA_SERVER, then
            127.0.0.1:50051, as ``aaa.connect``.
        token, credentials, timeout, retry_s: as ``aaa.connect``. Opening raises
            ``aaa.Unavailable`` naming the address when no server answers within ``timeout``.

    Attributes:
        client: the SDK's ``aaa.Client``, for everything these names do not cover.
        store: the event log (``await engine.store.read(run_id)``).

    On exit the engine stops every handler attached to it (running tool calls get the
    worker's grace to finish) and every subscription, then closes the connection.
    """

    def __init__(
        self,
        address: str | Sequence[str] | None = None,
        *,
        token: str | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        timeout: float = 10.0,
        retry_s: float = 30.0,
    ) -> None:
        self._address = address
        self._connect_options: dict[str, Any] = dict(
            token=token, credentials=credentials, timeout=timeout, retry_s=retry_s
        )
        self._client: Client | None = None
        self._store: EventStore | None = None
        self._workers: list[Worker] = []
        self._starting: list[asyncio.Task[None]] = []
        self._subscriptions: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> Engine:
        await self.open()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        failure = await self._shutdown()
        if failure is not None and exc_type is None:  # never hide the block's own exception
            raise failure

    async def open(self) -> None:
        """Connect to the server and wait until it answers (what ``async with`` does first)."""
        if self._client is not None:
            raise RuntimeError("this Engine is open already")
        self._client = await connect(self._address, **self._connect_options)
        self._store = EventStore(self._client)

    async def close(self) -> None:
        """Stop the attached handlers and subscriptions, then close the connection (what leaving
        ``async with`` does). Raises the first error a handler's registration or a subscription
        ended with, so that it is not lost."""
        failure = await self._shutdown()
        if failure is not None:
            raise failure

    async def _shutdown(self) -> Exception | None:
        if self._client is None:
            return None
        for task in self._subscriptions:
            task.cancel()
        ended = await asyncio.gather(*self._starting, *self._subscriptions, return_exceptions=True)
        # Stopping a worker whose registration failed is a no-op, so all of them are stopped.
        await asyncio.gather(*(worker.stop() for worker in self._workers), return_exceptions=True)
        await self._client.close()
        self._client = self._store = None
        self._workers, self._starting, self._subscriptions = [], [], []
        return next((e for e in ended if isinstance(e, Exception)), None)

    @property
    def client(self) -> Client:
        """The SDK's client of this engine."""
        if self._client is None:
            raise RuntimeError(_NOT_OPEN)
        return self._client

    @property
    def store(self) -> EventStore:
        """The server's event log: ``await engine.store.read(run_id)``."""
        if self._store is None:
            raise RuntimeError(_NOT_OPEN)
        return self._store

    @property
    def models(self) -> list[str]:
        """The names of the models served by the handlers attached to this engine."""
        return list(dict.fromkeys(name for worker in self._workers for name in worker.models))

    def serve(self, worker: Worker) -> Worker:
        """Start an SDK worker of this engine's client now, and stop it when the engine closes.

        ``LLMHandler.attach`` and ``ToolHandler.attach`` come here; so can any
        ``engine.client.worker(...)``. The models it serves are those ``start`` picks from.
        """
        if worker.client is not self.client:
            raise ValueError("engine.serve takes a worker of this engine's client: engine.client.worker(...)")
        # attach() is a plain call in in-process programs: registration runs as a task, and
        # start() waits for it so that the run's tools are registered before StartRun.
        task = asyncio.create_task(worker.start(), name=f"aaa-engine-register-{worker.identity}")
        task.add_done_callback(_log_failure)
        self._workers.append(worker)
        self._starting.append(task)
        return worker

    async def ready(self) -> None:
        """Wait until every attached handler has registered with the server; raises a registration's error."""
        starting, self._starting = self._starting, []  # an error raised here is not raised again by close()
        ended = await asyncio.gather(*starting, return_exceptions=True)
        failure = next((e for e in ended if isinstance(e, BaseException)), None)
        if failure is not None:
            raise failure

    async def start(self, algo: ToolLoop, input: Mapping[str, Any]) -> Run:
        """Start a run of ``algo`` on the server and return its handle (the SDK's ``aaa.Run``:
        ``.run_id``, ``await run.signal(type, data)``, ``await run.result()``).

        Args:
            algo: a ``ToolLoop``, the server's tool loop over its registry's tools.
            input: ``{"task": str}``, optionally with ``"budget": Budget(...)``,
                ``"labels": {...}``, ``"system": str`` and ``"request_id": str``.
        """
        if not isinstance(algo, ToolLoop):
            raise TypeError(f"engine.start runs a ToolLoop(registry), not {algo!r}")
        if not isinstance(input, Mapping):
            raise TypeError(f"engine.start takes its input as a dict like {{'task': ...}}, not {input!r}")
        unknown = sorted(set(input) - _START_KEYS)
        if unknown:
            raise ValueError(f"engine.start: unknown input keys {unknown}; known: {sorted(_START_KEYS)}")
        task = input.get("task")
        if not isinstance(task, str) or not task:
            raise ValueError(f"engine.start needs input['task'], a non-empty str, not {task!r}")
        budget = input.get("budget")
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"input['budget'] must be a Budget(deadline_s=..., max_model_calls=...), not {budget!r}")
        await self.ready()
        return await self.client.start_run(
            task,
            model=self._model_of(algo),
            tools=algo.registry.tools,
            budget=budget,
            labels=input.get("labels"),
            request_id=input.get("request_id"),
            system=input.get("system") or "",
        )

    def _model_of(self, algo: ToolLoop) -> str:
        """The model a run of ``algo`` uses: its own, else the one model attached to this engine."""
        if algo.model:
            return algo.model
        models = self.models
        if len(models) == 1:
            return models[0]
        if not models:
            raise ValueError(
                "no model to run: attach an LLMHandler to the engine first, "
                "or name one with ToolLoop(registry, model=...)"
            )
        raise ValueError(f"the engine serves several models {models}: name one with ToolLoop(registry, model=...)")

    def subscribe(
        self, pattern: str | Sequence[str], handler: EventHandler, *, group: str, **options: Any
    ) -> asyncio.Task[None]:
        """Run ``handler(event)`` (sync or async) for each event matching ``pattern``, once per
        ``group`` across every process subscribed with it, until the engine closes.

        The handler returning acks the event; raising makes the server deliver it again
        (at least once: deduplicate on ``(event.run_id, event.seq)``). ``pattern`` is an
        event type, a prefix like ``"aaa.approval.*"``, ``"*"``, or a list of them;
        ``options`` go to ``Client.subscribe`` (``labels``, ``start_from``, ``ack_timeout_s``,
        ``max_deliveries``, ``max_in_flight``...). Returns at once with the subscription's
        task (cancel it to leave the group earlier).
        """
        if not callable(handler):
            raise TypeError(f"subscribe needs a handler(event) function, not {handler!r}")
        if not isinstance(group, str) or not group:
            raise ValueError(f"subscribe needs a group name (a non-empty str), not {group!r}")

        def on_delivery(delivery: Delivery) -> Awaitable[None] | None:
            return handler(delivery.event)  # the SDK awaits what an async handler returns

        task = asyncio.create_task(
            self.client.subscribe(pattern, on_delivery, group=group, **options), name=f"aaa-engine-subscribe-{group}"
        )
        task.add_done_callback(_log_failure)
        self._subscriptions.append(task)
        return task


def _log_failure(task: asyncio.Task[None]) -> None:
    """Log a handler's start or a subscription that failed, as it happens (close() raises it later)."""
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed: %s", task.get_name(), task.exception())
