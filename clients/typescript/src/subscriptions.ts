/**
 * Consumer groups: react to events once per group, durably (`SubscriptionService`).
 *
 * ```ts
 * await client.subscribe("aaa.approval.requested", async (delivery) => {
 *   await notify(delivery.event.runId, delivery.event.data);
 * }, { group: "acme.notify", signal });
 * ```
 *
 * Each matching event goes to one member of the group at a time. The
 * handler resolving acks the delivery; the handler throwing nacks it, so it
 * is delivered again (`attempt` + 1) until the group's `maxDeliveries` move
 * it to the dead-letter list. Delivery is at least once: deduplicate on
 * `(event.runId, event.seq)`.
 *
 * @module
 */

import type { MessageInitShape } from "@bufbuild/protobuf";
import { StartFrom, type SubscribeRequestSchema, type SubscriptionOpenSchema } from "./gen/aaa/v1/subscription_pb.js";
import { eventFromProto, optionalDate, type Event } from "./types.js";

/** One event handed to this member of the group. */
export interface Delivery {
  /** The id the SDK acks or nacks (each attempt has its own). */
  readonly deliveryId: string;
  /** The event; `(event.runId, event.seq)` identifies it across deliveries. */
  readonly event: Event;
  /** 1 for the first delivery of the event to the group, then 2, ... */
  readonly attempt: number;
  /** The event was put back from the dead-letter list. */
  readonly replayed: boolean;
  /** When the server delivers it again if the handler has not finished. */
  readonly ackDeadline?: Date;
}

/** Called for each delivery: resolving acks it, throwing nacks it. */
export type DeliveryHandler = (delivery: Delivery) => unknown;

/** Options of `Client.subscribe`. */
export interface SubscribeOptions {
  /** The group's name; the first member creates it. */
  group: string;
  /** Only events of runs carrying all of these labels. */
  labels?: Record<string, string>;
  /** Where a new group starts: "now" (default) or "beginning". */
  startFrom?: "now" | "beginning";
  /** A new group starts after this global position. */
  startAfterPosition?: number;
  /** Seconds before an unacked delivery is made again (0: the group's, 30 s). */
  ackTimeoutS?: number;
  /** Attempts before dead-lettering (0: the group's, 5). */
  maxDeliveries?: number;
  /** Unacked deliveries this member holds at most (0: 16). */
  maxInFlight?: number;
  /** Leave the group: `subscribe` then rejects with `Cancelled`. */
  signal?: AbortSignal;
}

type Request = MessageInitShape<typeof SubscribeRequestSchema>;

/** The `open` message of a subscription. */
export function openRequest(eventTypes: string | string[], options: SubscribeOptions): Request {
  const open: MessageInitShape<typeof SubscriptionOpenSchema> = {
    group: options.group,
    eventTypes: typeof eventTypes === "string" ? [eventTypes] : eventTypes,
    labels: { ...options.labels },
    ackTimeoutS: options.ackTimeoutS ?? 0,
    maxDeliveries: options.maxDeliveries ?? 0,
    maxInFlight: options.maxInFlight ?? 0,
    startFrom: options.startFrom === "beginning" ? StartFrom.BEGINNING : StartFrom.NOW,
  };
  if (options.startAfterPosition !== undefined) {
    open.startFrom = StartFrom.AFTER_POSITION;
    open.startAfterPosition = BigInt(options.startAfterPosition);
  }
  return { kind: { case: "open", value: open } };
}

/** Converts a wire Delivery. */
export function deliveryFromProto(d: {
  deliveryId: string;
  event?: Parameters<typeof eventFromProto>[0];
  attempt: number;
  replayed: boolean;
  ackDeadline?: Parameters<typeof optionalDate>[0];
}): Delivery {
  if (d.event === undefined) throw new Error("a delivery without its event");
  return {
    deliveryId: d.deliveryId,
    event: eventFromProto(d.event),
    attempt: d.attempt,
    replayed: d.replayed,
    ackDeadline: optionalDate(d.ackDeadline),
  };
}

/** Requests written to the stream in order: the open, then acks and nacks as handlers finish. */
export class Outbox {
  private readonly items: Request[] = [];
  private wake: (() => void) | undefined;

  constructor(first: Request) {
    this.items.push(first);
  }

  push(item: Request): void {
    this.items.push(item);
    this.wake?.();
  }

  /** The requests, until `signal` aborts. */
  async *drain(signal: AbortSignal): AsyncGenerator<Request, void, undefined> {
    // One abort listener for the whole drain, not one per wait.
    const onAbort = () => this.wake?.();
    signal.addEventListener("abort", onAbort, { once: true });
    try {
      while (!signal.aborted) {
        const item = this.items.shift();
        if (item !== undefined) {
          yield item;
          continue;
        }
        await new Promise<void>((resolve) => (this.wake = resolve));
        this.wake = undefined;
      }
    } finally {
      signal.removeEventListener("abort", onAbort);
    }
  }
}

/** Runs the handler; queues an ack when it resolves, a nack with the error when it throws. */
export async function handle(handler: DeliveryHandler, delivery: Delivery, outbox: Outbox): Promise<void> {
  try {
    await handler(delivery);
  } catch (err) {
    const reason = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
    outbox.push({ kind: { case: "nack", value: { deliveryId: delivery.deliveryId, reason } } });
    return;
  }
  outbox.push({ kind: { case: "ack", value: { deliveryId: delivery.deliveryId } } });
}
