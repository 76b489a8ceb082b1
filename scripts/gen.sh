#!/bin/sh
# Regenerates the Go code of the protobuf API under api/. Needs protoc and
# the well-known types' .proto files (Debian: protobuf-compiler and
# libprotobuf-dev); the plugins come from the root go.mod's tool directives
# (api/go.mod, the API module's own, requires their runtimes at the same
# versions: internal/layering checks it). The code is generated into a
# temporary directory and replaces api/'s generated files (not its go.mod or
# its hand-written packages) only when protoc succeeded.
set -eu
cd "$(dirname "$0")/.."
include=/usr/include
command -v protoc >/dev/null 2>&1 || { echo "error: protoc not found: apt-get install protobuf-compiler" >&2; exit 1; }
[ -f "$include/google/protobuf/timestamp.proto" ] ||
	{ echo "error: $include/google/protobuf/timestamp.proto not found: apt-get install libprotobuf-dev" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/bin" "$tmp/out"
go build -o "$tmp/bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$tmp/bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
protos=$(cd api && find . -name '*.proto' | sed 's|^\./||' | sort)
# shellcheck disable=SC2086
(cd api && PATH="$tmp/bin:$PATH" protoc -I . -I "$include" \
	--go_out="$tmp/out" --go_opt=paths=source_relative \
	--connect-go_out="$tmp/out" --connect-go_opt=paths=source_relative \
	$protos)
find api -name '*.pb.go' -delete
find api -type d -name '*connect' -exec rm -rf {} +
cp -R "$tmp/out/." api/
