"""The reference scenario: a tool marked requires_approval runs only after a human grants that exact call.

Start a server (`cargo run --release -- serve` in the repository), then run
`python examples/approval.py` (the address comes from env AAA_SERVER,
default 127.0.0.1:50051). It prints:

    waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}
    sent $250 to ACME

The worker (serving the tool wire_money and the model "seed") and the client
run in this one process; they could as well be separate programs.
"""

import asyncio
import os

import aaa
from aaa import text, tool, tool_call


@tool(requires_approval=True)
def wire_money(amount: int, to: str) -> str:
    """Send money."""
    return f"sent ${amount} to {to}"


def model(request):  # a fake LLM: any callable from request to reply
    last = request.messages[-1]
    if last.role == "user":
        return tool_call("wire_money", amount=250, to="ACME")
    return text(last.content)


async def main():
    client = await aaa.connect(os.environ.get("AAA_SERVER", "127.0.0.1:50051"))
    async with client, client.worker(tools=[wire_money], models={"seed": model}):
        run = await client.start_run("Pay ACME $250", model="seed", tools=[wire_money])
        request = await run.wait_for("aaa.approval.requested")
        print("waiting for approval of:", request.data["name"], request.data["arguments"])
        await run.signal("aaa.approval.granted", {"call_id": request.data["call_id"]})
        outcome = await run.result()
        print(outcome.value["text"])


if __name__ == "__main__":
    asyncio.run(main())
