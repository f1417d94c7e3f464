#!/usr/bin/env bash
# aaa as an MCP gateway, tested with the official MCP SDKs as clients: the
# Python SDK (test_gateway.py, pytest) and the TypeScript SDK
# (ts/gateway.test.mjs, node --test). Upstreams: a small MCPServer (FastMCP)
# that counts its executions (upstream.py) and
# @modelcontextprotocol/server-everything. Makes or reuses tests/mcp/.venv
# (requirements.txt from PyPI) and tests/mcp/ts/node_modules (`npm ci`,
# install scripts off: none of these packages has one), then runs both
# against the server binary (env AAA_BIN, default target/debug/aaa: run
# `cargo build` first). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")"
if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
.venv/bin/python -m pip install --quiet --disable-pip-version-check -r requirements.txt
(cd ts && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error)

echo "-- the MCP Python SDK as client"
.venv/bin/python -m pytest -q --timeout 180 -p no:cacheprovider "$@" test_gateway.py

echo "-- the MCP TypeScript SDK as client"
(cd ts && AAA_MCP_PYTHON="$PWD/../.venv/bin/python" node --test --test-timeout=180000 gateway.test.mjs)
