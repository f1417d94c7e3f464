"""The reference scenario, denied: the tool never runs and the model explains the refusal.

Start a server (`cargo run --release -- serve` in the repository), then run
`python examples/deny.py` (address from env AAA_SERVER, default
127.0.0.1:50051). It prints:

    waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}
    I did not pay ACME: the transfer was refused (over the daily limit).

A denial reaches the model as the tool's result: a tool message whose
``error`` has type "ApprovalDenied" and the reason as message.
"""

import asyncio
import os

import aaa
from aaa import text, tool, tool_call


@tool(requires_approval=True)
def wire_money(amount: int, to: str) -> str:
    """Send money."""
    return f"sent ${amount} to {to}"


def model(request):  # a fake LLM that explains a refused tool call
    last = request.messages[-1]
    if last.role == "user":
        return tool_call("wire_money", amount=250, to="ACME")
    if last.error is not None and last.error.type == "ApprovalDenied":
        return text(f"I did not pay ACME: the transfer was refused ({last.error.message}).")
    return text(last.content)


async def main():
    client = await aaa.connect(os.environ.get("AAA_SERVER", "127.0.0.1:50051"))
    async with client, client.worker(tools=[wire_money], models={"seed": model}):
        run = await client.start_run("Pay ACME $250", model="seed", tools=[wire_money])
        request = await run.wait_for("aaa.approval.requested")
        print("waiting for approval of:", request.data["name"], request.data["arguments"])
        await run.deny(request.data["call_id"], "over the daily limit")
        outcome = await run.result()
        print(outcome.value["text"])


if __name__ == "__main__":
    asyncio.run(main())
