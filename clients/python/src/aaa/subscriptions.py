"""Consumer groups: react to events once per group, durably (``SubscriptionService``).

::

    async def notify(delivery: aaa.Delivery) -> None:
        print("approval needed:", delivery.event.run_id, delivery.event.data["call_id"])

    await client.subscribe("aaa.approval.requested", notify, group="acme.notify")

Each matching event goes to one member of the group at a time. The handler
returning acks the delivery; the handler raising nacks it, so it is delivered
again (``attempt`` + 1), to this or another member, until the group's
``max_deliveries`` move it to the dead-letter list. Delivery is at least
once: deduplicate on ``(event.run_id, event.seq)``.

When the stream ends for a reason that passes (the server ended it, stopped,
restarted or was unreachable, or dropped the member as too slow), the group
is joined again with a backoff (50 ms doubling up to ``REJOIN_CAP_S``), until
the caller cancels; refusals that cannot get better (a bad pattern,
GROUP_MISMATCH, PERMISSION_DENIED...) end it with their error.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from dataclasses import dataclass
from datetime import datetime
from typing import Any, AsyncIterator, Awaitable, Callable, Union

import grpc.aio

from ._backoff import Backoff
from ._connection import Connection
from ._proto.aaa.v1 import subscription_pb2
from .errors import AaaError, MemberTooSlow, Unavailable, from_rpc_error
from .types import Event, _time

log = logging.getLogger("aaa.subscriptions")

#: ``Client.subscribe``'s ``start_from`` values.
START_FROM = {
    "now": subscription_pb2.START_FROM_NOW,
    "beginning": subscription_pb2.START_FROM_BEGINNING,
}


@dataclass(frozen=True)
class Delivery:
    """One event handed to this member of the group.

    Attributes:
        delivery_id: the id the SDK acks or nacks (each attempt has its own).
        event: the event; ``(event.run_id, event.seq)`` identifies it across deliveries.
        attempt: 1 for the first delivery of the event to the group, then 2, ...
        replayed: the event was put back from the dead-letter list.
        ack_deadline: when the server delivers it again if the handler has not returned.
    """

    delivery_id: str
    event: Event
    attempt: int
    replayed: bool
    ack_deadline: datetime | None

    @classmethod
    def from_proto(cls, msg: subscription_pb2.Delivery) -> Delivery:
        """Convert an ``aaa.v1.Delivery``."""
        return cls(
            delivery_id=msg.delivery_id,
            event=Event.from_proto(msg.event),
            attempt=msg.attempt,
            replayed=msg.replayed,
            ack_deadline=_time(msg, "ack_deadline"),
        )


Handler = Callable[[Delivery], Union[Awaitable[None], None]]


#: The longest wait between two joins of a group whose stream ended.
REJOIN_CAP_S = 5.0


def _rejoin(err: AaaError) -> bool:
    """True for ends of a Subscribe stream that pass: the server going away,
    unreachable or refusing writes (UNAVAILABLE), or this member dropped as too slow."""
    return isinstance(err, (Unavailable, MemberTooSlow))


async def follow_group(client: Connection, opening: subscription_pb2.SubscriptionOpen, handler: Handler) -> None:
    """Join the group of ``opening`` and handle its deliveries, joining again after
    every end that passes, until cancelled (the loop of ``Client.subscribe``)."""
    backoff = Backoff(None, cap_s=REJOIN_CAP_S)
    while True:
        # Acks and nacks from the handlers' tasks, written by the call in order.
        outgoing: asyncio.Queue[subscription_pb2.SubscribeRequest] = asyncio.Queue()
        outgoing.put_nowait(subscription_pb2.SubscribeRequest(open=opening))

        async def requests(queue: asyncio.Queue[Any]) -> AsyncIterator[subscription_pb2.SubscribeRequest]:
            while True:
                yield await queue.get()

        call = client.stubs.subscription.Subscribe(requests(outgoing))  # this join's queue, not the next one's
        handling: set[asyncio.Task[None]] = set()
        try:
            async for response in call:
                backoff.reset()
                if response.WhichOneof("item") == "delivery":
                    delivery = Delivery.from_proto(response.delivery)
                    task = asyncio.create_task(_handle(handler, delivery, outgoing))
                    handling.add(task)
                    task.add_done_callback(handling.discard)
            log.info("the server ended the stream of group %s; joining it again", opening.group)
        except grpc.aio.AioRpcError as rpc_error:
            err = from_rpc_error(rpc_error)
            if not _rejoin(err):
                raise err from rpc_error
            log.info("the stream of group %s ended (%s); joining it again", opening.group, err)
        finally:
            call.cancel()
            for task in handling:
                task.cancel()
        await backoff.wait()  # unacked deliveries come again after the join


async def _handle(handler: Handler, delivery: Delivery, outgoing: asyncio.Queue[Any]) -> None:
    """Run the handler; ack when it returns, nack with the error when it raises."""
    try:
        result = handler(delivery)
        if inspect.isawaitable(result):
            await result
    except Exception as exc:  # noqa: BLE001 - any failure of the handler is a nack
        nack = subscription_pb2.Nack(delivery_id=delivery.delivery_id, reason=f"{type(exc).__name__}: {exc}")
        outgoing.put_nowait(subscription_pb2.SubscribeRequest(nack=nack))
    else:
        ack = subscription_pb2.Ack(delivery_id=delivery.delivery_id)
        outgoing.put_nowait(subscription_pb2.SubscribeRequest(ack=ack))
