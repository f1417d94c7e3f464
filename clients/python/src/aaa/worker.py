"""The worker: serve tools and models to the runs of an aaa server.

::

    worker = client.worker(tools=[wire_money], models={"seed": model})
    async with worker:          # registers, then polls for tasks
        ...                     # leaving the block stops it gracefully

The worker calls RegisterWorker, then loops on PollTask. Each task is one
exclusive attempt: the worker runs the tool (async functions on the event
loop, sync ones in a thread pool) or the model handler, sends heartbeats at a
third of the task's ``heartbeat_timeout_s`` while it runs, and reports the
result with CompleteTask. A result whose reply is lost (UNAVAILABLE, including
STORAGE_UNAVAILABLE, or DEADLINE_EXCEEDED: each try waits 10 s) is sent again
with the same token, with backoff, for up to 30 s in all; the server records it
once and answers a repeat with ``already_recorded``. An exception becomes FailTask with the exception's
class name as error type and its text as message: the server retries per the
tool's policy, then gives the failure to the model. Raise ``NonRetryable``
(or a subclass) to skip the retries. When a heartbeat answers that the run no
longer wants the attempt (cancelled, deadline passed, attempt superseded), the
work is cancelled and nothing is reported. Heartbeats and reports go to the
server that owns the task's run when the client, given several addresses,
knows it.

Inside a tool, ``aaa.current_task()`` tells which run, call and attempt is
running; pass ``call_id`` to the outside world as an idempotency key.
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import inspect
import json
import logging
import os
import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Iterable, Mapping

import grpc
import grpc.aio

from . import _otel
from ._backoff import Backoff
from ._connection import Connection
from ._proto.aaa.v1 import types_pb2, worker_pb2
from .errors import AaaError, FailedPrecondition, InvalidArgument, NotFound, from_rpc_error
from .models import ModelRequest, as_reply
from ._tool import Tool
from .types import dumps

log = logging.getLogger("aaa.worker")

#: How long a worker keeps sending a result whose reply was lost, in all.
REPORT_RETRY_S = 30.0
#: How long one try of CompleteTask or FailTask waits for its reply.
REPORT_TRY_TIMEOUT_S = 10.0
# Failures after which the server may or may not have the result: send it again.
_LOST_REPLY = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


class NonRetryable(Exception):
    """Raise this (or a subclass) from a tool to fail the call without retries."""


@dataclass(frozen=True)
class TaskInfo:
    """The attempt a tool or model handler is running: ``run_id``, ``call_id``, ``attempt`` and more."""

    run_id: str
    call_id: str
    attempt: int
    kind: str
    name: str
    heartbeat_timeout_s: float
    deadline_at: datetime | None
    #: W3C trace context of the server's span of this attempt ("" from an older server).
    traceparent: str = ""


_current: contextvars.ContextVar[TaskInfo] = contextvars.ContextVar("aaa_current_task")


def current_task() -> TaskInfo:
    """The attempt being run, from inside a tool or model handler (LookupError elsewhere)."""
    return _current.get()


_UNSET: Any = object()


class Worker:
    """Serves tools and models. Create with ``client.worker(...)``; run with ``async with worker:``
    or ``await worker.start()`` / ``await worker.stop()``.

    Args:
        client: the connection to use (an ``aaa.Client``).
        tools: ``@tool`` functions to serve.
        models: model name -> handler (a callable from ``ModelRequest`` to a reply).
        identity: the worker's name in events; defaults to "python-HOST-PID". With auth on it
            belongs to the principal that first uses it: another principal gets
            ``IdentityTaken``.
        concurrency: at most this many tasks run at once.
        poll_wait_s: longest wait of one PollTask (0: the server's cap).
        stop_grace_s: how long ``stop()`` lets running tasks finish before
            cancelling them (None: wait for them).
    """

    def __init__(
        self,
        client: Connection,
        *,
        tools: Iterable[Tool] = (),
        models: Mapping[str, Callable[..., Any]] | None = None,
        identity: str | None = None,
        concurrency: int = 10,
        poll_wait_s: float = 0.0,
        stop_grace_s: float | None = 30.0,
    ) -> None:
        if concurrency < 1:
            raise ValueError("concurrency must be at least 1")
        self.client = client
        self.tools = {t.name: t for t in tools}
        self.models = dict(models or {})
        self.identity = identity or f"python-{socket.gethostname()}-{os.getpid()}"
        self.concurrency = concurrency
        self.poll_wait_s = poll_wait_s
        self.stop_grace_s = stop_grace_s
        self._slots = asyncio.Semaphore(concurrency)
        self._inflight: set[asyncio.Task[None]] = set()
        self._poller: asyncio.Task[None] | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._stopped = asyncio.Event()

    async def __aenter__(self) -> Worker:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def register(self) -> list[types_pb2.ToolDefinition]:
        """Declare this worker's tools and models to the server; returns the definitions as stored."""
        request = worker_pb2.RegisterWorkerRequest(
            identity=self.identity,
            tools=[t.definition() for t in self.tools.values()],
            models=list(self.models),
        )
        response = await self.client._call(self.client.stubs.worker.RegisterWorker, request)
        return list(response.tools)

    async def start(self) -> None:
        """Register, then poll for tasks in the background."""
        if self._poller is not None:
            raise RuntimeError("worker already started")
        await self.register()
        self._executor = ThreadPoolExecutor(self.concurrency, thread_name_prefix="aaa-worker")
        self._stopped.clear()
        self._poller = asyncio.create_task(self._poll_loop(), name=f"aaa-worker-{self.identity}")

    async def run(self) -> None:
        """Start (if needed) and serve until ``stop()`` is called."""
        if self._poller is None:
            await self.start()
        await self._stopped.wait()

    async def stop(self, grace_s: Any = _UNSET) -> None:
        """Stop polling, let running tasks finish (up to ``grace_s`` seconds, by
        default ``stop_grace_s``; None waits for them), then cancel the rest and
        report them failed with error type WorkerStopped."""
        if self._poller is None:
            return
        grace = self.stop_grace_s if grace_s is _UNSET else grace_s
        self._poller.cancel()
        await asyncio.gather(self._poller, return_exceptions=True)
        self._poller = None
        if self._inflight:
            _, pending = await asyncio.wait(set(self._inflight), timeout=grace)
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None
        self._stopped.set()

    async def _poll_loop(self) -> None:
        request = worker_pb2.PollTaskRequest(
            identity=self.identity, tools=list(self.tools), models=list(self.models), wait_s=self.poll_wait_s
        )
        delay = 0.05
        while True:
            await self._slots.acquire()
            try:
                response = await self.client.stubs.worker.PollTask(request)
            except grpc.aio.AioRpcError as err:
                self._slots.release()
                log.warning("PollTask failed (%s); retrying in %.2fs", from_rpc_error(err), delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
                continue
            except BaseException:
                self._slots.release()
                raise
            delay = 0.05
            if not response.HasField("task"):
                self._slots.release()
                continue
            task = asyncio.create_task(self._handle(response.task))
            self._inflight.add(task)
            task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._inflight.discard(task)
        self._slots.release()
        if not task.cancelled() and task.exception() is not None:
            log.error("task handler failed", exc_info=task.exception())

    async def _handle(self, task: worker_pb2.Task) -> None:
        """Run one attempt with heartbeats, then report it."""
        work = asyncio.create_task(self._execute(task))
        heartbeat = asyncio.create_task(self._heartbeat(task, work))
        try:
            report = await asyncio.shield(work)
        except asyncio.CancelledError:
            if heartbeat.done() and not heartbeat.cancelled() and heartbeat.result():
                return  # the server no longer wants this attempt
            work.cancel()
            error = types_pb2.ErrorDetail(type="WorkerStopped", message=f"worker {self.identity} stopped")
            await self._report(task, worker_pb2.FailTaskRequest(token=task.token, error=error))
            raise
        finally:
            heartbeat.cancel()
        await self._report(task, report)

    async def _heartbeat(self, task: worker_pb2.Task, work: asyncio.Task[Any]) -> bool:
        """Heartbeat until cancelled; cancel ``work`` and return True if the server gives up on it."""
        interval = (task.heartbeat_timeout_s or 30.0) / 3
        heartbeat = self.client._for_run(task.run_id, lambda stubs: stubs.worker.HeartbeatTask)
        while True:
            await asyncio.sleep(interval)
            try:
                response = await heartbeat(worker_pb2.HeartbeatTaskRequest(token=task.token), timeout=interval)
            except grpc.aio.AioRpcError as err:
                error = from_rpc_error(err)
                if isinstance(error, (FailedPrecondition, NotFound, InvalidArgument)):
                    log.info("attempt %s of %s abandoned: %s", task.attempt, task.call_id, error)
                    work.cancel()
                    return True
                continue  # transient: the next heartbeat may get through
            if response.cancel_requested:
                log.info("attempt %s of %s: the run asked to stop", task.attempt, task.call_id)
                work.cancel()
                return True

    async def _execute(self, task: worker_pb2.Task) -> worker_pb2.CompleteTaskRequest | worker_pb2.FailTaskRequest:
        """Run the tool or model; return the report to send."""
        kind = task.WhichOneof("kind")
        name = task.tool.name if kind == "tool" else task.model.model
        deadline = task.deadline_at.ToDatetime(tzinfo=timezone.utc) if task.HasField("deadline_at") else None
        info = TaskInfo(
            task.run_id, task.call_id, task.attempt, kind or "", name, task.heartbeat_timeout_s, deadline,
            task.traceparent,
        )
        _current.set(info)
        # With OpenTelemetry set up, the handler runs in a span under the server's
        # span of this attempt, so the handler's own spans join the run's trace.
        with _otel.task_span(kind or "", name, task) as span:
            try:
                if kind == "tool":
                    tool = self.tools.get(name)
                    if tool is None:
                        raise NonRetryable(f"worker {self.identity} does not serve tool {name!r}")
                    arguments = json.loads(task.tool.arguments_json or "{}")
                    output = await self._invoke(tool.fn, **arguments)
                    return worker_pb2.CompleteTaskRequest(token=task.token, output_json=dumps(output))
                handler = self.models.get(name)
                if handler is None:
                    raise NonRetryable(f"worker {self.identity} does not serve model {name!r}")
                reply = as_reply(await self._invoke(handler, ModelRequest.from_task(task)))
                return worker_pb2.CompleteTaskRequest(token=task.token, reply=reply.to_proto())
            except Exception as exc:
                log.info("%s %s attempt %s failed: %r", kind, name, task.attempt, exc)
                _otel.fail(span, exc)
                error = types_pb2.ErrorDetail(type=type(exc).__name__, message=str(exc))
                return worker_pb2.FailTaskRequest(
                    token=task.token, error=error, non_retryable=isinstance(exc, NonRetryable)
                )

    async def _invoke(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call fn: async functions on the loop, sync ones in the worker's thread pool."""
        if inspect.iscoroutinefunction(fn):
            return await fn(*args, **kwargs)
        context = contextvars.copy_context()
        call = functools.partial(context.run, fn, *args, **kwargs)
        result = await asyncio.get_running_loop().run_in_executor(self._executor, call)
        if inspect.isawaitable(result):
            result = await result
        return result

    async def _report(
        self, task: worker_pb2.Task, request: worker_pb2.CompleteTaskRequest | worker_pb2.FailTaskRequest
    ) -> None:
        """Send CompleteTask or FailTask, again with the same token and result while the reply
        is lost (for up to ``REPORT_RETRY_S``); a refused report (stale attempt, finished run)
        is only logged."""
        try:
            await asyncio.wait_for(self._send_report(task, request), REPORT_RETRY_S)
        except asyncio.TimeoutError:
            log.warning("gave up reporting attempt %s of %s after %gs", task.attempt, task.call_id, REPORT_RETRY_S)
        except FailedPrecondition as err:  # superseded attempt or finished run: nothing to do
            log.info("result of a task was refused: %s", err)
        except AaaError as err:
            log.warning("result of a task was refused: %s", err)

    async def _send_report(
        self, task: worker_pb2.Task, request: worker_pb2.CompleteTaskRequest | worker_pb2.FailTaskRequest
    ) -> None:
        complete = isinstance(request, worker_pb2.CompleteTaskRequest)
        method = self.client._for_run(
            task.run_id, lambda stubs: stubs.worker.CompleteTask if complete else stubs.worker.FailTask
        )
        backoff = Backoff(None)  # _report bounds the whole
        while True:
            try:
                response = await method(request, timeout=REPORT_TRY_TIMEOUT_S)
            except grpc.aio.AioRpcError as err:
                # The reply was lost (or the server could not write): the server
                # takes the same token and result again, and says if it had it.
                if err.code() in _LOST_REPLY:
                    log.debug("reporting attempt %s of %s failed (%s); sending it again",
                              task.attempt, task.call_id, from_rpc_error(err))
                    await backoff.wait()
                    continue
                raise from_rpc_error(err) from err
            if response.already_recorded:
                log.debug("attempt %s of %s: recorded already (an earlier reply was lost)", task.attempt, task.call_id)
            return
