#!/usr/bin/env python3
"""Runs the README's walkthrough as printed, against a real server.

The README is the first thing a newcomer runs, line by line; this keeps
every line of it working. It starts `aaa serve` on an ephemeral port with a
throwaway data dir, takes the walkthrough's shell block (the fenced `sh`
block under "## Walkthrough with grpcurl") and runs it with bash, with only
the address changed (`A=...`, and AAA_SERVER for the `aaa` lines), the aaa
binary and grpcurl on PATH. Then it runs step 5 once more with nothing
waiting (it must say so, without a traceback or INVALID_TOKEN), and the
`aaa` commands the README's prose prints after the block (deny, edit,
decisions from a file, standing grants), each found by its text in the
README. A failure names the README line.

Usage: python3 tests/readme_walkthrough.py --aaa target/debug/aaa \\
           [--grpcurl PATH] [--readme README.md]
"""

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile

WALKTHROUGH = "## Walkthrough with grpcurl"


def fail(message):
    print(f"readme walkthrough: FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def walkthrough_block(lines):
    """The walkthrough's first fenced sh block: (its first line's number, its lines)."""
    try:
        start = lines.index(WALKTHROUGH)
    except ValueError:
        fail(f"README has no '{WALKTHROUGH}' section")
    for at in range(start, len(lines)):
        if lines[at].strip() == "```sh":
            end = lines.index("```", at + 1)
            return at + 2, lines[at + 1 : end]
    fail(f"no ```sh block under '{WALKTHROUGH}'")


def step(block, number):
    """The lines of step NUMBER of the block (from '# N.' to the next step)."""
    start = next(i for i, l in enumerate(block) if l.startswith(f"# {number}."))
    end = next(i for i, l in enumerate(block) if l.startswith(f"# {number + 1}."))
    return start, block[start:end]


def inline_command(text, prefix):
    """The README's inline code span that starts with PREFIX, joined onto one
    line as the shell reads it, with its README line number."""
    # Fenced blocks are not inline spans: blank them, keeping line numbers.
    text = re.sub(r"```.*?```", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    for match in re.finditer(r"`([^`]+)`", text):
        span = " ".join(match.group(1).split())
        if span.startswith(prefix):
            return text.count("\n", 0, match.start()) + 1, span
    fail(f"the README no longer prints a command starting with '{prefix}'")


class Server:
    """`aaa serve` on an ephemeral port with a throwaway data dir."""

    def __init__(self, aaa, workdir):
        self.process = subprocess.Popen(
            [aaa, "serve", "--listen", "127.0.0.1:0", "--data-dir", os.path.join(workdir, "data")],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
        )
        self.printed = []
        for line in self.process.stdout:
            self.printed.append(line.rstrip("\n"))
            found = re.match(r"aaa serving on (\S+)", line)
            if found:
                self.address = found.group(1)
                self.printed.append(self.process.stdout.readline().rstrip("\n"))
                return
        fail("aaa serve ended without saying where it serves")

    def stop(self):
        self.process.terminate()
        self.process.wait()


def run_bash(script, env, cwd):
    return subprocess.run(
        ["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=120
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--aaa", required=True)
    parser.add_argument("--grpcurl", default=shutil.which("grpcurl"))
    parser.add_argument("--readme", default="README.md")
    args = parser.parse_args()
    if not args.grpcurl:
        fail("no grpcurl: put one on PATH or pass --grpcurl")
    readme = open(args.readme, encoding="utf-8").read()
    lines = readme.splitlines()
    first, block = walkthrough_block(lines)

    workdir = tempfile.mkdtemp(prefix="aaa-readme-")
    server = Server(os.path.abspath(args.aaa), workdir)
    try:
        bin_dir = os.path.join(workdir, "bin")
        os.mkdir(bin_dir)
        os.symlink(os.path.abspath(args.aaa), os.path.join(bin_dir, "aaa"))
        os.symlink(os.path.abspath(args.grpcurl), os.path.join(bin_dir, "grpcurl"))
        env = dict(os.environ)
        env["PATH"] = bin_dir + os.pathsep + env["PATH"]
        env["AAA_SERVER"] = "http://" + server.address
        for name in ("AAA_TOKEN", "AAA_LOG", "AAA_PUBLIC_URL", "NO_COLOR"):
            env.pop(name, None)
        # What the README says `serve` prints (the web inbox's section).
        for said in ("# aaa serving on 127.0.0.1:50051 with data in ./aaa-data",
                     "# aaa web inbox at http://127.0.0.1:50051/"):
            if said not in lines:
                fail(f"the README no longer shows `{said}`")
            line = lines.index(said) + 1
            expected = (said[2:].replace("127.0.0.1:50051", server.address)
                        .replace("./aaa-data", os.path.join(workdir, "data")))
            if expected not in server.printed:
                fail(f"README line {line}: serve printed {server.printed}, not `{expected}`")
        printed = [l for l in block if l.startswith("A=")]
        if printed != ["A=127.0.0.1:50051"]:
            fail(f"README line {first}: the walkthrough should set A=127.0.0.1:50051 once")
        script = [f"A={server.address}" if l.startswith("A=") else l for l in block]

        # Step 5 first, with nothing waiting: a clear message, no traceback.
        offset, five = step(script, 5)
        head = script[: step(script, 3)[0]]  # steps 1-2: a run whose call waits
        ran = run_bash("\n".join(head + five), env, workdir)
        said = ran.stdout + ran.stderr
        if "Traceback" in said or "INVALID_TOKEN" in said or "no call waits" not in said:
            fail(f"README line {first + offset}: step 5 with nothing approved should say "
                 f"that no call waits, and nothing else; it printed:\n{said}")

        # The whole block as printed, stopping at the first line that fails.
        trap = (
            "set -eo pipefail; "
            "trap 'echo \"README line $((LINENO + %d)) failed: $BASH_COMMAND\" >&2' ERR; "
            % (first - 1)
        )
        # The trap's line is the block's line 1: no newline after it.
        ran = run_bash(trap + "\n".join(script), env, workdir)
        if ran.returncode != 0:
            fail(f"the walkthrough failed:\n{ran.stdout}\n{ran.stderr}")
        for expected in ('"aaa.approval.granted"', '"aaa.run.completed"', "sent $250 to ACME"):
            if expected not in ran.stdout:
                fail(f"the walkthrough's output lacks {expected}:\n{ran.stdout}")

        # The prose after the block: each command as printed, on a new run.
        start = "\n".join(head)
        for prefix, prepare in [
            ('aaa deny "$RUN" call-1', ""),
            ('aaa edit "$RUN" call-1', ""),
            ("aaa approvals ls --json > shown.json; aaa approve --from shown.json", ""),
        ]:
            line, command = inline_command(readme, prefix)
            ran = run_bash(f"set -eo pipefail\n{start}\n{prepare}{command}", env, workdir)
            if ran.returncode != 0:
                fail(f"README line {line}: `{command}` failed:\n{ran.stdout}\n{ran.stderr}")
        line, create = inline_command(readme, "aaa grants create")
        revoke_line, revoke = inline_command(readme, "aaa grants revoke ID")
        script = (
            f"set -eo pipefail\n{start}\n"
            f"ID=$({create})\n"
            + revoke.replace(" ID ", ' "$ID" ', 1)
        )
        ran = run_bash(script, env, workdir)
        if ran.returncode != 0:
            fail(f"README lines {line} and {revoke_line}: `{create}` then `{revoke}` "
                 f"failed:\n{ran.stdout}\n{ran.stderr}")
        print("readme walkthrough: every line ran as printed")
    finally:
        server.stop()
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
