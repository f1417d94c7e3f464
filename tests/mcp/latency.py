"""The latency aaa adds to an ungated MCP call: N sequential calls of the
upstream's `echo` made directly (the MCP Python SDK launching
tests/mcp/upstream.py over stdio) and through aaa (`aaa serve --mcp` with
the same upstream, the SDK over Streamable HTTP, one session), p50 and p99
of each. Not a test: `tests/mcp/.venv/bin/python tests/mcp/latency.py [N]`
after `bash tests/mcp/run.sh` made the venv (AAA_BIN as for the tests)."""

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
    return f"p50 {p(0.50):.2f} ms, p99 {p(0.99):.2f} ms, mean {statistics.mean(ordered) * 1000:.2f} ms"


async def timed(client: Client, n: int) -> list[float]:
    await client.call_tool("echo", {"text": "warm"})
    samples = []
    for i in range(n):
        start = time.perf_counter()
        result = await client.call_tool("echo", {"text": f"call {i}"})
        samples.append(time.perf_counter() - start)
        assert not result.is_error
    return samples


async def main(n: int) -> None:
    with tempfile.TemporaryDirectory() as root:
        log = Path(root) / "executions.jsonl"
        env = {**os.environ, "AAA_MCP_TEST_LOG": str(log)}
        direct = StdioServerParameters(command=sys.executable, args=[str(HERE / "upstream.py")], env=env)
        async with Client(direct, mode="legacy") as client:
            print(f"direct (stdio):  {percentiles(await timed(client, n))}")
        (Path(root) / "mcp.toml").write_text(
            f'[[upstream]]\nname = "bank"\ncommand = {json.dumps(sys.executable)}\n'
            f'args = [{json.dumps(str(HERE / "upstream.py"))}]\n'
            f'env = {{ AAA_MCP_TEST_LOG = {json.dumps(str(log))} }}\n[[upstream.tool]]\nname = "echo"\n')
        server = subprocess.Popen(
            [str(AAA), "serve", "--listen", "127.0.0.1:0", "--data-dir", f"{root}/data", "--mcp", f"{root}/mcp.toml"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        try:
            address = re.search(r"serving on (\S+:\d+)", server.stdout.readline()).group(1)
            async with Client(f"http://{address}/mcp", mode="legacy") as client:
                print(f"through aaa:     {percentiles(await timed(client, n))}")
        finally:
            server.terminate()
            server.wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]) if len(sys.argv) > 1 else 300))
