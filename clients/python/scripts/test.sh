#!/usr/bin/env bash
# Test the Python SDK: make or reuse clients/python/.venv, install the package
# with its test extras (versions from constraints.txt), check that the
# generated stubs are fresh relative to proto/, then run pytest against the
# server binary (env AAA_BIN, default target/debug/aaa: run `cargo build` first).
# Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -x .venv/bin/python ]; then
    "${PYTHON:-python3}" -m venv .venv
fi
rm -rf build src/*.egg-info   # setuptools would package stale copies from build/
.venv/bin/python -m pip install --quiet --disable-pip-version-check -c constraints.txt ".[test]"
.venv/bin/python scripts/generate.py --check
exec .venv/bin/python -m pytest "$@"
