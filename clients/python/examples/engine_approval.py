"""The reference scenario written against the in-process-style names (aaa.runtime, aaa.tools,
aaa.llm, aaa.algos), running on the server: the tool runs only after a human grants the call.

Start a server (`cargo run --release -- serve` in the repository), then run
`python examples/engine_approval.py` (address from env AAA_SERVER, default
127.0.0.1:50051). It prints:

    waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}
    sent $250 to ACME
"""

import asyncio

from aaa.algos import ToolLoop
from aaa.llm import FakeLLMClient, LLMHandler, fake
from aaa.runtime import Engine
from aaa.tools import ToolHandler, ToolRegistry, tool


@tool(requires_approval=True)
def wire_money(amount: int, to: str) -> str:
    """Send money."""
    return f"sent ${amount} to {to}"


def llm(request):  # a fake model: pay on the user's message, then repeat the tool's result
    last = request.messages[-1]
    if last.role == "user":
        return fake.tool_call("wire_money", amount=250, to="ACME")
    return fake.text(last.content)


async def wait_for(engine, run_id, event_type):
    """The run's first event of this type, polling the event log."""
    while True:
        for event in await engine.store.read(run_id):
            if event.type == event_type:
                return event
        await asyncio.sleep(0.05)


async def main():
    registry = ToolRegistry([wire_money])
    async with Engine() as engine:                 # env AAA_SERVER, else 127.0.0.1:50051
        LLMHandler(FakeLLMClient(llm)).attach(engine)
        ToolHandler(registry).attach(engine)
        run = await engine.start(ToolLoop(registry), {"task": "Pay ACME $250"})
        request = await wait_for(engine, run.run_id, "aaa.approval.requested")
        print("waiting for approval of:", request.data["name"], request.data["arguments"])
        await run.signal("aaa.approval.granted", {"call_id": request.data["call_id"]})
        outcome = await run.result()
        print(outcome.value["text"])


if __name__ == "__main__":
    asyncio.run(main())
