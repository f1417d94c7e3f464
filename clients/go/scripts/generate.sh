#!/usr/bin/env bash
# Generate the Go code of the aaa.v1 API (aaav1/) from ../../proto.
#
#   scripts/generate.sh           regenerate aaav1/
#   scripts/generate.sh --check   regenerate into a temporary directory and
#                                 fail if aaav1/ differs (stale or hand-edited)
#
# Needs only Go: buf, protoc-gen-go and protoc-gen-go-grpc are installed at the
# pinned versions below with `go install` (through the Go module proxy) into
# clients/go/.bin/. No protoc is needed: buf compiles the proto files itself
# and carries the well-known types. The first run on a fresh machine builds buf
# (about two minutes); later runs reuse .bin/.
set -euo pipefail
cd "$(dirname "$0")/.."

BUF_VERSION=v1.75.0
# Keep equal to google.golang.org/protobuf in go.mod.
PROTOC_GEN_GO_VERSION=v1.36.12
PROTOC_GEN_GO_GRPC_VERSION=v1.6.2

BIN="$PWD/.bin"
PROTO_DIR=../../proto

# install NAME PACKAGE VERSION: go install PACKAGE@VERSION into .bin unless
# that exact version is there already.
install() {
    local stamp="$BIN/.$1@$3"
    if [ ! -x "$BIN/$1" ] || [ ! -e "$stamp" ]; then
        echo "installing $2@$3 into $BIN" >&2
        GOBIN="$BIN" go install "$2@$3"
        rm -f "$BIN/.$1@"*
        touch "$stamp"
    fi
}
install buf github.com/bufbuild/buf/cmd/buf "$BUF_VERSION"
install protoc-gen-go google.golang.org/protobuf/cmd/protoc-gen-go "$PROTOC_GEN_GO_VERSION"
install protoc-gen-go-grpc google.golang.org/grpc/cmd/protoc-gen-go-grpc "$PROTOC_GEN_GO_GRPC_VERSION"
export PATH="$BIN:$PATH"

case "${1:-}" in
"")
    rm -f aaav1/*.pb.go
    buf generate "$PROTO_DIR" --template buf.gen.yaml
    echo "generated aaav1/ from $PROTO_DIR"
    ;;
--check)
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    buf generate "$PROTO_DIR" --template buf.gen.yaml --output "$tmp"
    if ! diff -ru aaav1 "$tmp/aaav1"; then
        echo "aaav1/ is stale: run clients/go/scripts/generate.sh and commit the result" >&2
        exit 1
    fi
    echo "aaav1/ is up to date with $PROTO_DIR"
    ;;
*)
    echo "usage: $0 [--check]" >&2
    exit 64
    ;;
esac
