#!/usr/bin/env bash
# aaa as an MCP gateway, tested with the official MCP Python SDK as client and
# a small MCPServer (FastMCP) upstream: make or reuse tests/mcp/.venv, install
# requirements.txt from PyPI, run pytest against the server binary (env
# AAA_BIN, default target/debug/aaa: run `cargo build` first). Extra
# arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
exec .venv/bin/python -m pytest -q --timeout 180 -p no:cacheprovider "$@" test_gateway.py
