/**
 * Retrying and cancelling: the backoff every retry loop of the SDK waits with, and the signals
 * that cancel a call. Beneath the connection, the client and the worker, which all retry.
 *
 * @module
 */

import { setTimeout as sleep } from "node:timers/promises";
import { AaaError, Cancelled, Code } from "./errors.js";

/** Exponential backoff (50 ms doubling up to `maxDelayMs`) within a time budget (`Infinity`: no end). */
export class Backoff {
  private delay = 50;
  private deadline = 0;

  constructor(
    private readonly budgetMs: number,
    private readonly maxDelayMs = 1000,
  ) {
    this.reset();
  }

  /** Start over: full budget, short delay. */
  reset(): void {
    this.delay = 50;
    this.deadline = Date.now() + this.budgetMs;
  }

  /** Sleeps before the next try; false when the budget is spent. Throws `Cancelled` if `signal` aborts. */
  async wait(signal?: AbortSignal): Promise<boolean> {
    if (Date.now() + this.delay > this.deadline) return false;
    try {
      await sleep(this.delay, undefined, { signal });
    } catch {
      throw cancelledBy(signal);
    }
    this.delay = Math.min(this.delay * 2, this.maxDelayMs);
    return true;
  }
}

/** The error of a call aborted by `signal`: its reason when that is an {@link AaaError}, else `Cancelled`. */
export function cancelledBy(signal: AbortSignal | undefined): AaaError {
  const reason: unknown = signal?.reason;
  if (reason instanceof AaaError) return reason;
  return new Cancelled(reason instanceof Error ? reason.message : "the call was aborted", { code: Code.Canceled, cause: reason });
}

/** Signals combined: aborted when any of them is. */
export function anySignal(...signals: (AbortSignal | undefined)[]): AbortSignal {
  return AbortSignal.any(signals.filter((s): s is AbortSignal => s !== undefined));
}
