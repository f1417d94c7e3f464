"""The latency aaa adds to an ungated MCP call: sequential calls of the
upstream's `echo` made directly (the MCP Python SDK launching
tests/mcp/upstream.py over stdio) and through aaa (`aaa serve --mcp` with
the same upstream, the SDK over Streamable HTTP, one session per round),
alternating direct and through-aaa rounds so that both see the same machine;
p50 and p99 of each round and of all rounds together. Not a test:
`tests/mcp/.venv/bin/python tests/mcp/latency.py [CALLS [ROUNDS]]` after
`bash tests/mcp/run.sh` made the venv (AAA_BIN as for the tests: give a
release build)."""

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mcp import Client, StdioServerParameters

HERE = Path(__file__).resolve().parent
AAA = Path(os.environ.get("AAA_BIN", HERE.parents[1] / "target" / "debug" / "aaa"))


def percentiles(samples: list[float]) -> str:
    ordered = sorted(samples)
    p = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000
    return f"p50 {p(0.50):6.2f} ms  p99 {p(0.99):6.2f} ms  mean {statistics.mean(ordered) * 1000:6.2f} ms  (n={len(ordered)})"


async def timed(client: Client, n: int) -> list[float]:
    for _ in range(5):
        await client.call_tool("echo", {"text": "warm"})
    samples = []
    for i in range(n):
        start = time.perf_counter()
        result = await client.call_tool("echo", {"text": f"call {i}"})
        samples.append(time.perf_counter() - start)
        assert not result.is_error
    return samples


async def main(n: int, rounds: int) -> None:
    print(f"aaa: {AAA}; {n} calls per round, {rounds} rounds, alternating")
    with tempfile.TemporaryDirectory() as root:
        log = Path(root) / "executions.jsonl"
        env = {**os.environ, "AAA_MCP_TEST_LOG": str(log)}
        direct = StdioServerParameters(command=sys.executable, args=[str(HERE / "upstream.py")], env=env)
        (Path(root) / "mcp.toml").write_text(
            f'[[upstream]]\nname = "bank"\ncommand = {json.dumps(sys.executable)}\n'
            f'args = [{json.dumps(str(HERE / "upstream.py"))}]\n'
            f'env = {{ AAA_MCP_TEST_LOG = {json.dumps(str(log))} }}\n[[upstream.tool]]\nname = "echo"\n')
        server = subprocess.Popen(
            [str(AAA), "serve", "--listen", "127.0.0.1:0", "--data-dir", f"{root}/data", "--mcp", f"{root}/mcp.toml"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        all_direct: list[float] = []
        all_aaa: list[float] = []
        try:
            address = re.search(r"serving on (\S+:\d+)", server.stdout.readline()).group(1)
            for r in range(rounds):
                async with Client(direct, mode="legacy") as client:
                    samples = await timed(client, n)
                all_direct += samples
                print(f"round {r + 1} direct (stdio):  {percentiles(samples)}")
                async with Client(f"http://{address}/mcp", mode="legacy") as client:
                    samples = await timed(client, n)
                all_aaa += samples
                print(f"round {r + 1} through aaa:     {percentiles(samples)}")
        finally:
            server.terminate()
            server.wait()
        print(f"all direct (stdio):  {percentiles(all_direct)}")
        print(f"all through aaa:     {percentiles(all_aaa)}")
        d50 = sorted(all_aaa)[len(all_aaa) // 2] - sorted(all_direct)[len(all_direct) // 2]
        d99 = sorted(all_aaa)[int(0.99 * len(all_aaa))] - sorted(all_direct)[int(0.99 * len(all_direct))]
        print(f"added by aaa:        p50 {d50 * 1000:6.2f} ms  p99 {d99 * 1000:6.2f} ms")


if __name__ == "__main__":
    calls = int(sys.argv[1]) if len(sys.argv) > 1 else 300
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 5
    asyncio.run(main(calls, rounds))
