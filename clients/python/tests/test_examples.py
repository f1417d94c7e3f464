"""The shipped examples print exactly what the README promises, against the real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, address: str) -> subprocess.CompletedProcess:
    """Run examples/<name> with AAA_SERVER set; return the finished process."""
    env = {**os.environ, "AAA_SERVER": address}
    return subprocess.run(
        [sys.executable, str(EXAMPLES / name)], env=env, capture_output=True, text=True, timeout=60
    )


def test_approval_example_prints_exactly(server):
    done = run_example("approval.py", server.address)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}\n"
        "sent $250 to ACME\n"
    )


def test_deny_example_explains_the_refusal(server):
    done = run_example("deny.py", server.address)
    assert done.returncode == 0, done.stderr
    assert done.stdout == (
        "waiting for approval of: wire_money {'amount': 250, 'to': 'ACME'}\n"
        "I did not pay ACME: the transfer was refused (over the daily limit).\n"
    )
