"""Retrying transient failures: the backoff every retry loop of the SDK waits with, and which
errors are worth a retry. Beneath the client, the worker and the subscriptions, which all retry."""

from __future__ import annotations

import asyncio

import grpc
import grpc.aio


class Backoff:
    """Exponential backoff (50 ms doubling up to ``cap_s``) within a time budget (None: no end)."""

    def __init__(self, budget_s: float | None, cap_s: float = 1.0) -> None:
        self.budget_s = budget_s
        self.cap_s = cap_s
        self.reset()

    def reset(self) -> None:
        """Start over: full budget, short delay."""
        self.delay = 0.05
        self.deadline = None if self.budget_s is None else asyncio.get_running_loop().time() + self.budget_s

    async def wait(self) -> bool:
        """Sleep before the next try; False when the budget is spent."""
        loop = asyncio.get_running_loop()
        if self.deadline is not None and loop.time() + self.delay > self.deadline:
            return False
        await asyncio.sleep(self.delay)
        self.delay = min(self.delay * 2, self.cap_s)
        return True


def transient(err: grpc.RpcError) -> bool:
    """True for errors worth retrying: the server was unreachable or went away."""
    return isinstance(err, grpc.aio.AioRpcError) and err.code() == grpc.StatusCode.UNAVAILABLE
