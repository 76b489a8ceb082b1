# dsec — make targets. `make help` lists them.
GO      ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
# The binary is static: it is also the init inside sandboxes whose root file
# systems have no C library.
LDFLAGS := -X main.version=$(VERSION) -linkmode external -extldflags -static
TAGS    := netgo,osusergo
# The API (generated code, error kinds, the sparse tar format) and the Go SDK
# are modules of their own; the server's go.mod points at them with replace.
MODULES := api sdk/go

.PHONY: help build test test-modules test-root test-all lint fmt gen check-gen fresh-build bench density net-leak bench-fusion bench-pack bench-layers bench-lazy bench-cli bench-network bench-pause clean

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-13s %s\n", $$1, $$2}'

build: ## build the static binaries bin/dsec (the command line) and bin/dsec-node (the platform; dsec hands it up, keeper, purge, ...)
	CGO_ENABLED=1 $(GO) build -tags $(TAGS) -ldflags '$(LDFLAGS)' -o bin/dsec-node ./cmd/dsec
	CGO_ENABLED=0 $(GO) build -tags $(TAGS),dsec_client -ldflags '-X main.version=$(VERSION)' -o bin/dsec ./cmd/dsec

test: ## unit tests with -race (root tests skip without root; internal/layering runs the API's and SDK's too)
	$(GO) test -race ./...

test-modules: ## the API and SDK modules on their own (GOWORK=off, in their directories): tests with -race
	@for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) test -race ./...) || exit 1; done

test-root: build ## every test as root, including real sandboxes (sudo make test-root)
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) test -race -count=1 ./...

test-crash: ## kill -9 of dsec up and of the keeper at each step of create and delete (root; a -tags dsec_crashhook build)
	CGO_ENABLED=1 $(GO) build -tags $(TAGS),dsec_crashhook -ldflags '$(LDFLAGS)' -o bin/dsec-crash ./cmd/dsec
	DSEC_BIN=$(CURDIR)/bin/dsec-crash DSEC_NODE_BIN=$(CURDIR)/bin/dsec-crash $(GO) test -tags dsec_crashhook -count=1 -run 'TestEdgeCrash|TestKeeperCrash' ./e2e/ ./internal/edge/backend/container/

test-all: ## what CI runs: packages, build, generated code, lint, all tests
	scripts/test.sh

lint: ## gofmt, go.mod files tidy, go vet and staticcheck, in every module
	@out=$$(gofmt -l $$(git ls-files '*.go' | grep -v '\.pb\.go$$\|connect\.go$$')); \
		if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@for m in . $(MODULES); do \
		(cd $$m && GOWORK=off $(GO) mod tidy -diff) || { echo "$$m/go.mod is not tidy: run go mod tidy there"; exit 1; }; \
		(cd $$m && GOWORK=off $(GO) vet ./...) || exit 1; \
	done
	$(GO) tool staticcheck ./... $(addprefix github.com/dsecproject/dsec/,$(addsuffix /...,$(MODULES)))
	$(GO) vet -tags dsec_client ./cmd/dsec
	$(GO) tool staticcheck -tags dsec_client ./cmd/dsec

fmt: ## format the code
	gofmt -w $$(git ls-files '*.go')

gen: ## regenerate the protobuf API code
	scripts/gen.sh

check-gen: ## fail when the generated API code is stale
	@scripts/gen.sh
	@git diff --exit-code --stat -- api || \
		(echo "generated code is stale: run make gen and commit" && exit 1)

fresh-build: ## build and check-gen on a minimal Debian root with only the script's package list (root)
	scripts/fresh-build.sh

# Extra flags of the benchmarks, e.g. make bench BENCH_FLAGS='-n 5 -burst 50 -idle 50'.
BENCH_FLAGS   ?=
DENSITY_FLAGS ?=

bench: build ## dsec vs raw crun/runc and docker, interleaved: JSON, table, targets, bin/bench-latency.png
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/suite -json bin/bench.json -png bin/bench-latency.png $(BENCH_FLAGS)

density: build ## density drill: 3,200 idle sandboxes, exec in each, none lost, clean removal
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/density -json bin/density.json $(DENSITY_FLAGS)

net-leak: build ## the network cleanup check at the issue's size: 1,000 sandboxes with network made and deleted, nothing left (root; CI runs 200)
	DSEC_BIN=$(CURDIR)/bin/dsec DSEC_NET_LEAK_N=1000 $(GO) test -count=1 -v -run TestNetworkLeak ./e2e/

bench-fusion: build ## SandboxFusion run_code: HumanEval problems/s at concurrency 1, 2, 4, 8 (JSON, table)
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/fusion -json bin/bench-fusion.json

# Extra flags of bench-pack, e.g. make bench-pack PACK_FLAGS='-sizes 1M,10M -files 1000 -n 1'.
PACK_FLAGS ?=

bench-pack: build ## pack_diff time and freeze vs diff size (1 MiB to 100 MiB, 1,000 and 10,000 files): JSON, table
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/pack -json bin/bench-pack.json $(PACK_FLAGS)

# Extra flags of bench-layers, e.g. make bench-layers LAYERS_FLAGS='-n 20 -c 4 -rounds 3'.
LAYERS_FLAGS ?=

bench-layers: build ## composable layers vs per-sandbox tar extraction, 50 sandboxes sharing base + toolkit: JSON, table
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/layers -json bin/bench-layers.json $(LAYERS_FLAGS)

# Extra flags of bench-lazy, e.g. make bench-lazy LAZY_FLAGS='-images 2 -size 100M'.
LAZY_FLAGS ?=

bench-lazy: build ## lazy vs eager layers from a capped blobserver, 10 images × 5 sandboxes: JSON, table, targets, bin/bench-lazy.png
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/lazy -json bin/bench-lazy.json -png bin/bench-lazy.png $(LAZY_FLAGS)

# Extra flags of bench-cli, e.g. make bench-cli CLI_FLAGS='-n 300', or
# CLI_FLAGS='-base bin/dsec-node' to time the platform binary's CLI too.
CLI_FLAGS ?=

bench-cli: build ## dsec exec ID -- true (a new CLI process) vs the Go SDK's Exec round trip, taking turns: JSON, table, target
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/cli -json bin/bench-cli.json $(CLI_FLAGS)

# Extra flags of bench-network, e.g. make bench-network NETWORK_FLAGS='-n 50 -rounds 9'.
NETWORK_FLAGS ?=

bench-network: build ## issue 14 (root): create with/without network, 1 GiB through the proxy vs direct, connection rates: JSON, table, targets
	CGO_ENABLED=1 $(GO) build -tags $(TAGS) -ldflags '-linkmode external -extldflags -static' -o bin/bench-network ./bench/network
	DSEC_BIN=$(CURDIR)/bin/dsec bin/bench-network -json bin/bench-network.json $(NETWORK_FLAGS)

# Extra flags of bench-pause, e.g. make bench-pause PAUSE_FLAGS='-sizes 64,256 -n 1 -many 100 -mechs='.
PAUSE_FLAGS ?=

bench-pause: build ## issue 15 (root): pause/resume of 64-1,024 MiB sandboxes vs raw freeze, thaw and swap, 500 at once, mechanisms compared: JSON, table, targets
	DSEC_BIN=$(CURDIR)/bin/dsec $(GO) run ./bench/pause -json bin/bench-pause.json $(PAUSE_FLAGS)

.PHONY: lazyspike
LAZYSPIKE_FLAGS ?=
lazyspike: ## issue 7 spike (root): lazy layers through FUSE + EROFS, faults; JSON bin/lazyspike.json, table
	$(GO) run ./bench/lazyspike -json bin/lazyspike.json $(LAZYSPIKE_FLAGS)

clean: ## remove build output
	rm -rf bin
