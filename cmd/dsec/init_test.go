package main

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
)

// maxInitBytes bounds what the initialisation of each of our packages may
// allocate. dsec-node links the server into every one of its commands (the
// keeper and the exec helper's start included), and the command line
// links the packages it shares with it, so every package initialiser runs
// before each of them; compiling a pattern or building a table there
// (hundreds of KiB, a millisecond each) belongs in a first use instead
// (internal/lazyregexp, sync.OnceValue). A few prometheus descriptors or
// small maps fit well under it. TestClientLinksNoServer keeps the server
// out of the command line.
const maxInitBytes = 16 << 10

// TestInitIsCheap runs this test binary, which links every package the dsec
// binary links, with GODEBUG=inittrace=1 and no tests, and checks what the
// initialisation of each package of ours allocated. Allocations, unlike
// times, do not depend on how loaded the machine is.
func TestInitIsCheap(t *testing.T) {
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "GODEBUG=inittrace=1")
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%s -test.run=^$: %v\n%s", os.Args[0], err, out)
	}
	inits, err := parseInitTrace(out)
	if err != nil {
		t.Fatal(err)
	}
	// The server must be linked (etcd's initialisers run), or the test
	// checks nothing.
	if _, ok := inits["go.etcd.io/etcd/server/v3/embed"]; !ok {
		t.Fatalf("no init of etcd's server in the trace: this test binary does not link what the dsec binary does")
	}
	for pkg, in := range inits {
		rel, ours := strings.CutPrefix(pkg, module+"/")
		// The generated API packages register their descriptors: that is
		// protobuf's, not ours to change.
		if !ours || strings.HasPrefix(rel, "api/") {
			continue
		}
		if in.bytes > maxInitBytes {
			t.Errorf("init of %s allocated %d bytes in %d allocations, want at most %d: every CLI command runs it; do the work on first use", pkg, in.bytes, in.allocs, maxInitBytes)
		}
	}
}

const module = "github.com/dsecproject/dsec"

type initCost struct{ bytes, allocs int64 }

// parseInitTrace parses the runtime's lines
// "init PKG @T ms, C ms clock, B bytes, N allocs".
func parseInitTrace(out []byte) (map[string]initCost, error) {
	inits := map[string]initCost{}
	sc := bufio.NewScanner(bytes.NewReader(out))
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "init ") {
			continue
		}
		var pkg string
		var at, clock float64
		var c initCost
		if _, err := fmt.Sscanf(line, "init %s @%f ms, %f ms clock, %d bytes, %d allocs", &pkg, &at, &clock, &c.bytes, &c.allocs); err != nil {
			return nil, fmt.Errorf("inittrace line %q: %v", line, err)
		}
		inits[pkg] = c
	}
	if len(inits) == 0 {
		return nil, fmt.Errorf("no inittrace lines in:\n%s", out)
	}
	return inits, nil
}
