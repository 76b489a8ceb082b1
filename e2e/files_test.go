package e2e

import (
	"strings"
	"testing"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// testListDirLinks checks that a listing names symlinks' targets through
// every layer: the SDK and `dsec fs ls`.
func testListDirLinks(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"job": "links"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(t.Context())
	if r, err := sb.Shell(ctx, "mkdir /w && echo hi > /w/f && ln -s f /w/rel && ln -s /proc/self/root /w/magic"); err != nil || r.ExitCode != 0 {
		t.Fatalf("set up links: %v, %+v", err, r)
	}
	ents, _, err := sb.ListDir(ctx, "/w")
	if err != nil {
		t.Fatalf("ListDir = %v", err)
	}
	got := map[string]string{}
	for _, e := range ents {
		got[e.Name] = e.Type + " " + e.LinkTarget
	}
	want := map[string]string{"f": "file ", "rel": "symlink f", "magic": "symlink /proc/self/root"}
	for name, w := range want {
		if got[name] != w {
			t.Errorf("ListDir(/w): %s = %q, want %q", name, got[name], w)
		}
	}
	out, errOut, code := p.CLI(t, "", "fs", "ls", sb.ID+":/w")
	if code != 0 || !strings.Contains(out, "rel -> f\n") || !strings.Contains(out, "magic -> /proc/self/root\n") {
		t.Errorf("dsec fs ls = %q, %q, exit %d; want the links' targets", out, errOut, code)
	}
}
