package container

import (
	"context"
	"encoding/hex"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/sandbox"
	"github.com/dsecproject/dsec/internal/sandbox/sandboxtest"
)

// TestSealedExecAdopted: a sealed exec runs with the image view in a
// sandbox the keeper made and, after a keeper restart, in one it adopted
// (whose layers it mounts again from the sandbox's record); the node's
// teardown checks that nothing of them, the .seal cgroups included, is left.
func TestSealedExecAdopted(t *testing.T) {
	n := newNode(t)
	b := n.open(t)
	ctx := context.Background()
	id := "sealed-" + hex.EncodeToString([]byte{byte(time.Now().UnixNano())})
	if _, err := b.Create(ctx, sandbox.Spec{ID: id, Layers: n.layers, Resources: sandbox.Resources{MemoryBytes: 64 << 20, CPUs: 1, Pids: 64, DiskBytes: 64 << 20}}); err != nil {
		t.Fatalf("Create = %v", err)
	}
	const script = "echo changed > /bin/true; cmp -s /.dsec/image/bin/true /bin/true || echo image; /.dsec/bin/busybox true && echo tools"
	sealed := func(b *Backend, when string) {
		t.Helper()
		r, err := sandboxtest.ExecErr(ctx, b, id, sandbox.ExecSpec{Argv: []string{"/.dsec/bin/sh", "-c", script}, Seal: sandbox.SealFreeze})
		if err != nil || r.Code != 0 || r.Stdout != "image\ntools\n" || !r.Sealed {
			t.Errorf("sealed exec %s = %+v, %v; want image and tools, sealed", when, r, err)
		}
	}
	sealed(b, "in a sandbox the keeper made")

	v, _ := b.Keeper().Version(ctx)
	if err := b.Keeper().Shutdown(ctx, false); err != nil {
		t.Fatalf("keeper shutdown = %v", err)
	}
	waitGone(t, v.Pid)
	b.Close()
	b2 := n.open(t) // a new keeper, which adopts the sandbox
	defer b2.Close()
	sealed(b2, "in an adopted sandbox")
	sealed(b2, "again in an adopted sandbox")
	if err := b2.Delete(ctx, id); err != nil {
		t.Errorf("Delete of the adopted sandbox = %v", err)
	}
}
