#!/bin/sh
# sandboxfusion-images.sh: build the images of the SandboxFusion API's
# languages from Debian packages (this machine's apt sources), all three at
# once, against the dsec at $DSEC_ADDR (default http://127.0.0.1:7420):
#   sandboxfusion/python  python3
#   sandboxfusion/bash    bash coreutils grep sed gawk bc
#   sandboxfusion/go      golang-go, with a build cache warmed for the
#                         standard library's common packages
# Usage: scripts/sandboxfusion-images.sh [python] [bash] [go]   (default: all)
# The images are public (every project's sandboxes, and the SandboxFusion
# pool's, run them). An image that exists already is kept; REBUILD=1 builds
# it again and replaces it (--force: a Debian build is never byte for byte
# the same), which only the project that built it, or an admin key, may.
# $DSEC (default: dsec on PATH, else bin/dsec) is the dsec binary. Needs
# mmdebstrap (apt-get install mmdebstrap) and root, or unprivileged user
# namespaces with a range in /etc/subuid.
set -eu
cd "$(dirname "$0")/.."
DSEC=${DSEC:-$(command -v dsec || echo bin/dsec)}
[ -x "$DSEC" ] || { echo "error: no dsec binary (make build, or set DSEC)" >&2; exit 1; }
command -v mmdebstrap >/dev/null || { echo "error: mmdebstrap is not installed: apt-get install mmdebstrap" >&2; exit 1; }
langs=${*:-python bash go}
force=
[ "${REBUILD:-}" != 1 ] || force=--force
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# The Go image's cache: one program that imports the packages solutions
# use most, built with the image's own settings (CGO_ENABLED=0, GOCACHE).
GO_WARM='mkdir -p /tmp/warm && cd /tmp/warm
cat > main.go <<GO
package main

import (
	"bufio"
	"bytes"
	"container/heap"
	"container/list"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
	"unicode"
)

var _ = []any{bufio.NewReader, bytes.NewBuffer, heap.Init, list.New, json.Marshal, errors.New,
	math.Pi, big.NewInt, rand.Int, os.Exit, regexp.MustCompile, sort.Ints, strconv.Itoa,
	strings.Split, sync.NewCond, time.Now, unicode.IsDigit}

func main() { fmt.Println() }
GO
go build -o /dev/null main.go
cd / && rm -rf /tmp/warm'

build() {
	case $1 in
	python) "$DSEC" image build sandboxfusion/python --public $force --debian python3 --env PYTHONDONTWRITEBYTECODE=1 ;;
	bash) "$DSEC" image build sandboxfusion/bash --public $force --debian bash,coreutils,grep,sed,gawk,bc ;;
	go) "$DSEC" image build sandboxfusion/go --public $force --debian golang-go \
		--env CGO_ENABLED=0 --env GOCACHE=/var/cache/go-build --env GOFLAGS=-buildvcs=false \
		--env GOPATH=/root/go --run "$GO_WARM" ;;
	*) echo "unknown language $1: python, bash or go" >&2; return 2 ;;
	esac
}

start=$(date +%s)
existing=$("$DSEC" image ls -q)
for l in $langs; do
	if [ -z "$force" ] && printf '%s\n' "$existing" | grep -qx "sandboxfusion/$l:latest"; then
		echo "sandboxfusion/$l exists: kept (REBUILD=1 builds it again)"
		continue
	fi
	( s=$(date +%s); if build "$l" >"$logs/$l.log" 2>&1; then
		echo "built sandboxfusion/$l in $(( $(date +%s) - s ))s"; else
		echo "FAILED: sandboxfusion/$l:"; cat "$logs/$l.log"; touch "$logs/failed"; fi ) &
done
wait
[ ! -e "$logs/failed" ] || exit 1
echo "all built in $(( $(date +%s) - start ))s"
