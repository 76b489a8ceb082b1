package main

import (
	"os/exec"
	"strings"
	"testing"
)

// TestPlatformVerbsMatch: the client's stand-ins for the platform's verbs
// (forward.go) are named and described like the commands dsec-node runs.
func TestPlatformVerbsMatch(t *testing.T) {
	root := newRootCmd()
	for _, v := range platformVerbs {
		c, _, err := root.Find([]string{v.name})
		if err != nil || c == root || c.Name() != v.name {
			t.Errorf("platform verb %s: no such command of dsec-node (%v)", v.name, err)
			continue
		}
		if c.Short != v.short || c.Hidden != v.hidden {
			t.Errorf("platform verb %s: dsec-node's is %q hidden=%v, the table's %q hidden=%v", v.name, c.Short, c.Hidden, v.short, v.hidden)
		}
	}
	if c, _, err := root.Find([]string{"image", imageImportVerb.name}); err != nil || c.Name() != imageImportVerb.name || c.Short != imageImportVerb.short {
		t.Errorf("image import: %v %v", c, err)
	}
}

// TestClientLinksNoServer: the command line's build links none of the
// server's packages, whose initialisation would run before every command.
func TestClientLinksNoServer(t *testing.T) {
	out, err := exec.Command("go", "list", "-deps", "-tags", "netgo,osusergo,dsec_client", ".").CombinedOutput()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, out)
	}
	deps := strings.Fields(string(out))
	if len(deps) < 50 {
		t.Fatalf("go list -deps gave %d packages: %s", len(deps), out)
	}
	forbidden := []string{
		"go.etcd.io/etcd/server", "go.etcd.io/etcd/client", "github.com/prometheus/", "github.com/hanwen/go-fuse",
		"github.com/google/go-containerregistry", "github.com/google/go-cmp", "go.opentelemetry.io/",
		module + "/internal/nsexec", module + "/internal/edge", module + "/internal/keeper", module + "/internal/server",
		module + "/internal/apiserver", module + "/internal/cluster", module + "/internal/codeeval", module + "/internal/fusion",
	}
	for _, d := range deps {
		for _, f := range forbidden {
			if strings.HasPrefix(d, f) {
				t.Errorf("the command line links %s", d)
			}
		}
	}
}
