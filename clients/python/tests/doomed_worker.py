"""A worker process for test_worker: serves a tool whose attempts never finish, until it is killed.

Usage: python doomed_worker.py TOOL_NAME   (server address in env AAA_SERVER)
Prints "ready" once registered and polling, and "started ATTEMPT" when a call starts.
"""

import asyncio
import os
import sys

import aaa


async def main() -> None:
    @aaa.tool(name=sys.argv[1], retries=1, retry_backoff_s=0.1, heartbeat_timeout_s=1.0)
    async def flaky(x: int) -> int:
        """Hangs forever."""
        print("started", aaa.current_task().attempt, flush=True)
        await asyncio.Event().wait()
        return x

    client = await aaa.connect(os.environ["AAA_SERVER"])
    async with client.worker(tools=[flaky], identity="doomed"):
        print("ready", flush=True)
        await asyncio.Event().wait()


asyncio.run(main())
