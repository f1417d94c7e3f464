#!/usr/bin/env bash
# Generates src/gen (TypeScript, protoc-gen-es) from the server's proto files
# in ../../proto with buf (both from node_modules: run `npm ci` first).
#
#   scripts/generate.sh           regenerate src/gen
#   scripts/generate.sh --check   fail if src/gen differs from what the proto files generate
#
# Generated code is never edited by hand.
set -euo pipefail
cd "$(dirname "$0")/.."

buf=node_modules/.bin/buf
if [[ ! -x $buf || ! -x node_modules/.bin/protoc-gen-es ]]; then
  echo "generate.sh: buf or protoc-gen-es missing: run \`npm ci\` in $(pwd) first" >&2
  exit 1
fi

case "${1:-}" in
  "")
    "$buf" generate
    echo "generated src/gen from ../../proto"
    ;;
  --check)
    out=$(mktemp -d)
    trap 'rm -rf "$out"' EXIT
    "$buf" generate -o "$out"
    if ! diff -r "$out/src/gen" src/gen; then
      echo "generate.sh --check: src/gen is stale: run clients/typescript/scripts/generate.sh and commit the result" >&2
      exit 1
    fi
    echo "src/gen is up to date"
    ;;
  *)
    echo "usage: $0 [--check]" >&2
    exit 64
    ;;
esac
