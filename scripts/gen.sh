#!/bin/sh
# Regenerates the Go code of the protobuf API under api/. Needs protoc
# (Debian: protobuf-compiler); the plugins come from go.mod's tool directives.
set -eu
cd "$(dirname "$0")/.."
bin=$(mktemp -d)
trap 'rm -rf "$bin"' EXIT
go build -o "$bin/protoc-gen-go" google.golang.org/protobuf/cmd/protoc-gen-go
go build -o "$bin/protoc-gen-connect-go" connectrpc.com/connect/cmd/protoc-gen-connect-go
find api -name '*.pb.go' -delete
find api -type d -name '*connect' -exec rm -rf {} +
protos=$(cd api && find . -name '*.proto' | sed 's|^\./||' | sort)
(cd api && PATH="$bin:$PATH" protoc -I . -I /usr/include \
	--go_out=. --go_opt=paths=source_relative \
	--connect-go_out=. --connect-go_opt=paths=source_relative \
	$protos)
