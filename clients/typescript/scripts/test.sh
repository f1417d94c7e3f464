#!/usr/bin/env bash
# The TypeScript SDK's checks: install the pinned dependencies, check that the
# generated code is fresh, type-check, and run the tests against the real
# server binary (env AAA_BIN, default ../../target/debug/aaa: run
# `cargo build` in the repository first).
set -euo pipefail
cd "$(dirname "$0")/.."

echo "== typescript sdk: npm ci"
npm ci --no-audit --no-fund --ignore-scripts  # buf and esbuild work without their postinstall steps

echo "== typescript sdk: generated code is fresh"
bash scripts/generate.sh --check

echo "== typescript sdk: type-check"
npx tsc --noEmit

echo "== typescript sdk: tests"
node --import tsx --test --test-reporter=spec test/*.test.ts
