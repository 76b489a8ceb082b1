#!/bin/sh
# test.sh: the README's second command and what CI runs (.ci/run). Installs
# what the tests need, builds, checks the generated code and formatting,
# proves on a minimal Debian root that the package list is enough to build,
# then runs the API and SDK modules' tests on their own and every test of
# the server's module with -race: unit tests, root tests that create real
# sandboxes, and end-to-end tests through the SDK and CLI against a real
# `dsec up`. Root tests need root; in CI (CI=true) nothing is skipped.
set -eu
cd "$(dirname "$0")/.."
. scripts/lib.sh
need_root
find_go
install_packages $RUNTIME_PACKAGES $BUILD_PACKAGES
start=$(date +%s)
phase() { echo "== $1 (at $(( $(date +%s) - start ))s)"; }
phase build
make -s build
phase "generated code and formatting"
make -s check-gen lint
# The API and the Go SDK as a user gets them: each module on its own
# (GOWORK=off, its own go.mod). These tests are hermetic, so they are left
# cacheable: internal/layering's TestModulesAlone, in the run below, runs the
# same command and finds them done.
phase "the API and SDK modules on their own"
make -s test-modules
phase "the package list builds dsec on a minimal Debian root"
scripts/fresh-build.sh
phase tests
DSEC_BIN="$(pwd)/bin/dsec" go test -race -count=1 -timeout 20m ./...
phase "crashes of dsec up and the keeper at each step (a -tags dsec_crashhook build)"
make -s test-crash
phase done
