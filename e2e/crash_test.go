//go:build dsec_crashhook

package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/edge"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestEdgeCrashAtEachStep kills dsec up (SIGKILL, through the edge's crash
// points of a -tags dsec_crashhook build) at each step of a create and of
// a delete, and starts it again: the sandbox is either there and running
// (the crash came after its create was recorded as done) or gone without
// a trace, admission holds exactly what the listed sandboxes hold, and
// once they are deleted nothing is left on the host and admission is zero.
//
// Run it with a dsec binary built with the tag:
//
//	go build -tags netgo,osusergo,dsec_crashhook -ldflags '-linkmode external -extldflags -static' -o /tmp/dsec-crash ./cmd/dsec
//	DSEC_BIN=/tmp/dsec-crash go test -tags dsec_crashhook -run TestEdgeCrash ./e2e/
func TestEdgeCrashAtEachStep(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	key := p.AdminKey(t)
	opts := dsec.CreateOptions{Image: "busybox", Memory: 96 << 20, Labels: map[string]string{"job": "crash"}}
	for _, point := range edge.CrashPoints {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			deleting := point[:len("delete")] == "delete"
			var victim string
			if deleting {
				sb, err := p.Client(t, key).Create(ctx, opts)
				if err != nil {
					t.Fatalf("Create = %v", err)
				}
				victim = sb.ID
			}
			// Restart dsec up with the crash point armed.
			p.Stop(t)
			os.Setenv(edge.CrashEnv, "edge:"+point)
			p.Start(t)
			os.Unsetenv(edge.CrashEnv)
			c := p.Client(t, key)
			var err error
			if deleting {
				err = c.Delete(ctx, victim)
			} else {
				_, err = c.Create(ctx, opts)
			}
			if err == nil {
				t.Fatalf("the call passed crash point edge:%s: is DSEC_BIN built with -tags dsec_crashhook?", point)
			}
			if werr := p.Wait(t, time.Minute); werr == nil {
				t.Fatalf("dsec up exited cleanly at edge:%s, want killed", point)
			}
			p.Start(t)

			c = p.Client(t, key)
			sbs, err := c.List(ctx, map[string]string{"job": "crash"})
			if err != nil {
				t.Fatalf("List after the restart = %v", err)
			}
			var held int64
			for _, sb := range sbs {
				if sb.State != "running" {
					t.Errorf("after a crash at edge:%s: sandbox %s is %s (%s), want running or gone", point, sb.ID, sb.State, sb.Reason)
				}
				held += sb.Resources.Memory
			}
			switch want := map[string]int{"create:running": 1}[point]; {
			case len(sbs) != want:
				t.Errorf("after a crash at edge:%s: %d sandboxes, want %d", point, len(sbs), want)
			case deleting && len(sbs) > 0:
				t.Errorf("after a crash at edge:%s: the deleted sandbox is back", point)
			}
			if got := committed(t, p); got != held {
				t.Errorf("after a crash at edge:%s: admission holds %d MiB, the sandboxes %d MiB", point, got>>20, held>>20)
			}
			if _, err := c.DeleteSelector(ctx, map[string]string{"job": "crash"}); err != nil {
				t.Fatalf("delete the survivors = %v", err)
			}
			if got := committed(t, p); got != 0 {
				t.Errorf("after deleting everything: admission holds %d MiB, want 0", got>>20)
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && len(p.Footprint()) > 0 {
				time.Sleep(200 * time.Millisecond)
			}
			if left := p.Footprint(); len(left) > 0 {
				t.Errorf("after a crash at edge:%s and deleting everything, left on the host: %v", point, left)
			}
		})
	}
}

// TestEdgeCrashPause kills dsec up at each step of a pause and of a
// resume (the crash points of a -tags dsec_crashhook build) and starts it
// again: the sandbox is paused or running, never half-frozen (an exec
// works, and resumes it if it is paused), admission holds no more than its
// limit while paused and exactly its limit while running, and once it is
// deleted nothing is left. It needs the node side of issue 15 (the
// container backend's Pauser).
func TestEdgeCrashPause(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	key := p.AdminKey(t)
	const limit = 96 << 20
	opts := dsec.CreateOptions{Image: "busybox", Memory: limit, Labels: map[string]string{"job": "crash-pause"}}
	for _, point := range edge.PauseCrashPoints {
		t.Run(point, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
			defer cancel()
			resuming := point[:len("resume")] == "resume"
			sb, err := p.Client(t, key).Create(ctx, opts)
			if err != nil {
				t.Fatalf("Create = %v", err)
			}
			if _, err := sb.Shell(ctx, "echo kept > /tmp/f; sleep 1000 &"); err != nil {
				t.Fatal(err)
			}
			if resuming {
				if _, err := sb.Pause(ctx); err != nil {
					t.Fatalf("Pause = %v", err)
				}
			}
			p.Stop(t)
			os.Setenv(edge.CrashEnv, "edge:"+point)
			p.Start(t)
			os.Unsetenv(edge.CrashEnv)
			c := p.Client(t, key)
			if resuming {
				_, err = c.Sandbox(sb.ID).Resume(ctx)
			} else {
				_, err = c.Sandbox(sb.ID).Pause(ctx)
			}
			if err == nil {
				t.Fatalf("the call passed crash point edge:%s: is DSEC_BIN built with -tags dsec_crashhook?", point)
			}
			if werr := p.Wait(t, time.Minute); werr == nil {
				t.Fatalf("dsec up exited cleanly at edge:%s, want killed", point)
			}
			p.Start(t)
			c = p.Client(t, key)
			got, err := c.Get(ctx, sb.ID)
			if err != nil {
				t.Fatalf("Get after a crash at edge:%s = %v", point, err)
			}
			held := committed(t, p)
			switch got.State {
			case dsec.StatePaused:
				if held > limit {
					t.Errorf("after a crash at edge:%s: paused, admission holds %d MiB, above its limit", point, held>>20)
				}
			case dsec.StateRunning:
				if held != limit {
					t.Errorf("after a crash at edge:%s: running, admission holds %d MiB, want %d", point, held>>20, limit>>20)
				}
			default:
				t.Errorf("after a crash at edge:%s: %s (%s), want paused or running", point, got.State, got.Reason)
			}
			r, err := got.Shell(ctx, "cat /tmp/f; ps | grep -c '[s]leep 1000'")
			if err != nil || string(r.Stdout) != "kept\n1\n" {
				t.Errorf("exec after a crash at edge:%s = %q, %v; want the sandbox as it was", point, r.Stdout, err)
			}
			if held := committed(t, p); held != limit {
				t.Errorf("after the exec: admission holds %d MiB, want %d", held>>20, limit>>20)
			}
			if err := got.Delete(ctx); err != nil {
				t.Fatal(err)
			}
			if held := committed(t, p); held != 0 {
				t.Errorf("after deleting it: admission holds %d MiB, want 0", held>>20)
			}
			deadline := time.Now().Add(30 * time.Second)
			for time.Now().Before(deadline) && len(p.Footprint()) > 0 {
				time.Sleep(200 * time.Millisecond)
			}
			if left := p.Footprint(); len(left) > 0 {
				t.Errorf("after a crash at edge:%s and deleting the sandbox, left on the host: %v", point, left)
			}
		})
	}
}

var committedRe = regexp.MustCompile(`(?m)^dsec_node_memory_committed_bytes ([0-9.e+]+)$`)

// committed reads what admission holds from /metrics.
func committed(t *testing.T, p *platform) int64 {
	t.Helper()
	resp, err := http.Get(p.URL() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := committedRe.FindSubmatch(b)
	if m == nil {
		t.Fatalf("/metrics has no dsec_node_memory_committed_bytes:\n%s", b)
	}
	f, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(fmt.Errorf("dsec_node_memory_committed_bytes %q: %w", m[1], err))
	}
	return int64(f)
}
