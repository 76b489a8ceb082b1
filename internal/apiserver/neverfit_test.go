package apiserver

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestCreateNeverFits: a create no node could ever admit, however many
// sandboxes are deleted (memory, pids, disk), is InvalidArgument at once,
// naming the most any node gives, with no retry hint and nothing sent to
// a node; one
// that fits once sandboxes are deleted is ResourceExhausted with a hint.
func TestCreateNeverFits(t *testing.T) {
	ts := newTenancyServer(t, 0)
	ts.edge.mu.Lock()
	ts.edge.admissible, ts.edge.pidsMax, ts.edge.diskMax = 64<<30, 24576, 200<<30
	ts.edge.mu.Unlock()
	ctx := t.Context()
	ts.w.Poll(ctx)
	create := func(mem int64) error {
		_, err := ts.admin.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Memory: mem})
		return err
	}
	for _, tt := range []struct {
		name string
		opts dsec.CreateOptions
		want string
	}{
		{"memory 1 TiB", dsec.CreateOptions{Memory: 1 << 40}, "memory 1 TiB is more than any node can ever give a container sandbox: the most is 64 GiB, on node n1; ask for at most that (--memory)"},
		{"pids 10^9", dsec.CreateOptions{Pids: 1e9}, "pids 1000000000 is more than any node can ever give a container sandbox: the most is 24576, on node n1; ask for at most that (--pids)"},
		{"disk 10 TiB", dsec.CreateOptions{Disk: 10 << 40}, "disk 10 TiB is more than any node can ever give a container sandbox: the most is 200 GiB, on node n1; ask for at most that (--disk)"},
	} {
		tt.opts.Layers = []string{digestOf([]byte("x"))}
		start := time.Now()
		_, err := ts.admin.Create(ctx, tt.opts)
		var de *dsec.Error
		if !errors.Is(err, dsec.ErrInvalidArgument) || !errors.As(err, &de) {
			t.Fatalf("Create(%s) on a node admitting 64 GiB = %v, want InvalidArgument", tt.name, err)
		}
		if took := time.Since(start); took > time.Second {
			t.Errorf("Create(%s) took %s, want it at once", tt.name, took)
		}
		if de.RetryAfter != 0 {
			t.Errorf("Create(%s) = %v, want no retry hint", tt.name, err)
		}
		if de.Message != tt.want {
			t.Errorf("Create(%s) = %q, want %q", tt.name, de.Message, tt.want)
		}
	}
	ts.edge.mu.Lock()
	sent := len(ts.edge.creates)
	ts.edge.mu.Unlock()
	if sent != 0 {
		t.Errorf("creates no node could take reached the node %d times, want none", sent)
	}

	// 60 GiB placed, 8 GiB more fits once it is deleted: wait and retry.
	if err := create(60 << 30); err != nil {
		t.Fatalf("Create(60 GiB of 64) = %v", err)
	}
	ts.w.Poll(ctx)
	err := create(8 << 30)
	var de *dsec.Error
	if !errors.Is(err, dsec.ErrResourceExhausted) || !errors.As(err, &de) || de.RetryAfter <= 0 {
		t.Errorf("Create(8 GiB) with 4 GiB free of 64 = %v, want ResourceExhausted with a retry hint", err)
	}
}

// TestCreateAboveProjectMemoryLimit: a sandbox above its project's memory
// limit on its own can never be admitted: InvalidArgument, no hint.
func TestCreateAboveProjectMemoryLimit(t *testing.T) {
	ts := newTenancyServer(t, 0)
	ctx := t.Context()
	if _, err := ts.admin.SetProjectLimits(ctx, "small", dsec.LimitsUpdate{MemoryBytes: ptr[int64](2 << 30)}); err != nil {
		t.Fatal(err)
	}
	c := ts.client(t, "small", dsec.KeyOptions{})
	_, err := c.Create(ctx, dsec.CreateOptions{Layers: []string{digestOf([]byte("x"))}, Memory: 4 << 30})
	var de *dsec.Error
	if !errors.Is(err, dsec.ErrInvalidArgument) || !errors.As(err, &de) || de.RetryAfter != 0 ||
		!strings.Contains(de.Message, "project small") || !strings.Contains(de.Message, "2 GiB") {
		t.Errorf("Create(4 GiB) in a project limited to 2 GiB = %v, want InvalidArgument naming the project and its 2 GiB, no retry hint", err)
	}
}
