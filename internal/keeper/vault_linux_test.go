package keeper

import (
	"context"
	"io"
	"os"
	"testing"
	"time"
)

// TestVaultHandoff: a keeper that is replaced hands its vault to its
// successor, which then holds the same kernel objects: bytes written to a
// pipe whose read end was in the old vault are read from the new one.
func TestVaultHandoff(t *testing.T) {
	dir := shortTempDir(t)
	k1, _, c1 := newFakeKeeper(t, dir)
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	if err := k1.vault.put("n-vault", "resolver", r); err != nil {
		t.Fatal(err)
	}
	r.Close() // the vault keeps its own
	if err := k1.vault.put("n-vault", "tap", w); err != nil {
		t.Fatal(err)
	}
	// What Takeover asks of a protocol 3 keeper, and what its Run does
	// once it stopped serving.
	if err := c1.call(context.Background(), "POST", "/v1/shutdown", map[string][]string{"handoff": {"1"}}, nil, nil); err != nil {
		t.Fatalf("shutdown with handoff = %v", err)
	}
	k1.mu.Lock()
	ln := k1.handoff
	k1.mu.Unlock()
	if ln == nil {
		t.Fatal("the keeper does not wait to hand over")
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		k1.handOver(ln)
	}()
	_ = os.Remove(Layout{StateDir: dir}.Socket())
	k2, _, _ := newFakeKeeper(t, dir) // takes the vault over in its setup
	<-done
	k1.vault.closeAll() // the old keeper exits
	got := k2.vault.get("n-vault", "resolver")
	if got == nil || k2.vault.get("n-vault", "tap") == nil {
		t.Fatalf("the new keeper's vault lacks the handed-over fds: %v", k2.vault.fds)
	}
	if _, err := w.Write([]byte("same pipe")); err != nil {
		t.Fatal(err)
	}
	_ = got.SetReadDeadline(time.Now().Add(5 * time.Second))
	b := make([]byte, 9)
	if _, err := io.ReadFull(got, b); err != nil || string(b) != "same pipe" {
		t.Errorf("read from the handed-over fd = %q, %v; want what was written to the old one's pipe", b, err)
	}
	if _, err := os.Stat(Layout{StateDir: dir}.handoffSocket()); err == nil {
		t.Errorf("the handoff socket is left")
	}
	k2.vault.drop("n-vault")
	if k2.vault.get("n-vault", "resolver") != nil {
		t.Errorf("drop left an fd")
	}
}
