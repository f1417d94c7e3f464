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
"""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence, Union

import grpc.aio

from ._proto.aaa.v1 import subscription_pb2
from .errors import from_rpc_error
from .types import Event, _time

if TYPE_CHECKING:
    from .client import Client

_START_FROM = {
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


async def subscribe(
    client: Client,
    event_types: str | Sequence[str],
    handler: Handler,
    *,
    group: str,
    labels: Mapping[str, str] | None = None,
    start_from: str = "now",
    start_after_position: int | None = None,
    ack_timeout_s: float = 0.0,
    max_deliveries: int = 0,
    max_in_flight: int = 0,
) -> None:
    """Join ``group`` and call ``handler`` for each delivery, until cancelled.

    See ``Client.subscribe``.
    """
    from .client import _Backoff, _transient

    opening = subscription_pb2.SubscriptionOpen(
        group=group,
        event_types=[event_types] if isinstance(event_types, str) else list(event_types),
        labels=dict(labels or {}),
        ack_timeout_s=ack_timeout_s,
        max_deliveries=max_deliveries,
        max_in_flight=max_in_flight,
    )
    if start_after_position is not None:
        opening.start_from = subscription_pb2.START_FROM_AFTER_POSITION
        opening.start_after_position = start_after_position
    else:
        opening.start_from = _START_FROM[start_from]
    backoff = _Backoff(client.retry_s)
    while True:
        # Acks and nacks from the handlers' tasks, written by the call in order.
        outgoing: asyncio.Queue[subscription_pb2.SubscribeRequest] = asyncio.Queue()
        outgoing.put_nowait(subscription_pb2.SubscribeRequest(open=opening))

        async def requests() -> AsyncIterator[subscription_pb2.SubscribeRequest]:
            while True:
                yield await outgoing.get()

        call = client.stubs.subscription.Subscribe(requests())
        handling: set[asyncio.Task[None]] = set()
        try:
            async for response in call:
                backoff.reset()
                if response.WhichOneof("item") == "delivery":
                    delivery = Delivery.from_proto(response.delivery)
                    task = asyncio.create_task(_handle(handler, delivery, outgoing))
                    handling.add(task)
                    task.add_done_callback(handling.discard)
            return
        except grpc.aio.AioRpcError as err:
            # After a dropped connection the unacked deliveries come again.
            if _transient(err) and await backoff.wait():
                continue
            raise from_rpc_error(err) from err
        finally:
            call.cancel()
            for task in handling:
                task.cancel()


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
