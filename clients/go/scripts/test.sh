#!/usr/bin/env bash
# Test the Go SDK: generated code fresh relative to proto/, gofmt clean, go vet
# clean, then the tests (with the race detector) against the real server
# binary (env AAA_BIN, default ../../target/debug/aaa: run `cargo build` in the
# repository root first). Extra arguments go to `go test`.
# Needs Go 1.26 or later; everything else is fetched through the Go module proxy.
set -euo pipefail
cd "$(dirname "$0")/.."

echo "-- generated code"
scripts/generate.sh --check

echo "-- gofmt"
unformatted=$(gofmt -l .)
if [ -n "$unformatted" ]; then
    echo "gofmt would change:" >&2
    echo "$unformatted" >&2
    exit 1
fi

echo "-- go vet"
go vet ./...

echo "-- go test"
go test -race -count=1 "$@" ./...
