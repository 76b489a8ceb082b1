package edge

import (
	"context"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// FuzzPauseSequence runs sequences of requests on a few sandboxes: pauses
// and resumes by ID and by selector (also of another project's key),
// requests that resume, deletes, failing backends, restarts of the edge
// and crashes at each step of a pause and a resume (a record left in the
// state the step leaves, the backend as it was then, and a restart). After
// every step each record is as its backend is, nothing is half-frozen,
// and admission holds exactly what the records hold; another project's
// key never changed anything.
//
//	go test -run '^$' -fuzz FuzzPauseSequence -fuzztime 1m ./internal/edge/
func FuzzPauseSequence(f *testing.F) {
	for _, seed := range []string{
		"\x00\x01\x02\x03",         // pause, resume, exec, stat
		"\x00\x00\x01\x01",         // twice each
		"\x00\x09\x02",             // pause, restart, exec
		"\x0a\x0b\x0c\x0d\x02\x03", // crash points, then use
		"\x07\x00\x08\x01\x05",     // failing pause, failing resume, delete
		"\x04\x14\x24\x06",         // selectors, the other project
	} {
		f.Add([]byte(seed))
	}
	f.Fuzz(func(t *testing.T, ops []byte) {
		if len(ops) > 24 {
			ops = ops[:24]
		}
		n, p := newPauseNode(t)
		e := n.openPause(p.open())
		defer func() { e.Close() }()
		ctx := context.Background()
		mallory := Caller{Project: "mallory", KeyID: "km"}
		var ids []string
		for i := range 3 {
			r, err := e.Create(ctx, admin, CreateParams{Image: "busybox", Labels: map[string]string{"job": "j", "n": string(rune('a' + i))}}, "")
			if err != nil {
				t.Fatal(err)
			}
			ids = append(ids, r.ID)
		}
		restart := func() {
			e.Close()
			e = n.openPause(p.open())
		}
		noSend := func(ExecEvent) error { return nil }
		for _, op := range ops {
			id := ids[int(op>>4)%len(ids)]
			p.set(func(p *pauseNode) { p.pauseErr, p.half, p.resumeEr = nil, false, nil })
			switch op & 0x0f {
			case 0:
				e.Pause(ctx, admin, id, nil)
			case 1:
				e.Resume(ctx, admin, id, nil)
			case 2:
				e.Exec(ctx, admin, ExecParams{Sandbox: id, Argv: []string{"true"}}, noSend)
			case 3:
				e.Stat(ctx, admin, id, "/etc/passwd")
			case 4:
				e.Pause(ctx, admin, "", map[string]string{"job": "j"})
			case 5:
				e.Delete(ctx, admin, id)
			case 6:
				before := p.count("Pause") + p.count("Resume")
				e.Pause(ctx, mallory, id, nil)
				e.Resume(ctx, mallory, "", map[string]string{"job": "j"})
				e.Exec(ctx, mallory, ExecParams{Sandbox: id, Argv: []string{"true"}}, noSend)
				if after := p.count("Pause") + p.count("Resume"); after != before {
					t.Fatalf("another project's key paused or resumed a sandbox")
				}
			case 7:
				p.set(func(p *pauseNode) {
					p.pauseErr, p.half = errdefs.Newf(errdefs.ErrInternal, "reclaim failed"), op&0x10 != 0
				})
				e.Pause(ctx, admin, id, nil)
			case 8:
				p.set(func(p *pauseNode) { p.resumeEr = errdefs.Newf(errdefs.ErrInternal, "thaw failed") })
				e.Resume(ctx, admin, id, nil)
			case 9:
				restart()
			case 10: // a crash after running → pausing (edge:pause:marked)
				if _, err := e.transition(id, StateRunning, StatePausing, "", nil); err == nil {
					restart()
				}
			case 11: // a crash after the backend paused it (edge:pause:stopped)
				if _, err := e.transition(id, StateRunning, StatePausing, "", nil); err == nil {
					p.set(func(p *pauseNode) { p.paused[id] = true })
					restart()
				}
			case 12: // a crash after paused → resuming (edge:resume:marked)
				if r, err := e.store.get(id); err == nil && r.State == StatePaused {
					if _, err := e.transition(id, StatePaused, StateResuming, "", nil); err == nil {
						restart()
					}
				}
			case 13: // a crash after the backend resumed it (edge:resume:started)
				if r, err := e.store.get(id); err == nil && r.State == StatePaused {
					if _, err := e.transition(id, StatePaused, StateResuming, "", nil); err == nil {
						p.set(func(p *pauseNode) { delete(p.paused, id) })
						restart()
					}
				}
			case 14: // the backend's processes restarted and thawed it
				p.set(func(p *pauseNode) { delete(p.paused, id) })
				if err := e.reconcileOnce(ctx); err != nil {
					t.Fatal(err)
				}
			default:
				e.reap(time.Now().Add(48 * time.Hour)) // every TTL, the paused one too
			}
			checkConsistentFuzz(t, e, p, op)
		}
	})
}

// checkConsistentFuzz is checkConsistent for a sequence: failed records
// (a pause or resume the backend failed) and exited ones are allowed, and
// may be left paused by the backend.
func checkConsistentFuzz(t *testing.T, e *Edge, p *pauseNode, op byte) {
	t.Helper()
	recs, err := e.store.list()
	if err != nil {
		t.Fatal(err)
	}
	var held int64
	for _, r := range recs {
		held += memHeld(r)
		switch r.State {
		case StatePaused:
			if !p.isPaused(r.ID) {
				t.Fatalf("after op %#x: %s is paused, its backend has it running", op, r.ID)
			}
		case StateRunning:
			if p.isPaused(r.ID) {
				t.Fatalf("after op %#x: %s is running, its backend has it paused (half-frozen)", op, r.ID)
			}
		case StateFailed:
		default:
			t.Fatalf("after op %#x: %s is %s", op, r.ID, r.State)
		}
	}
	if got := e.admission().MemoryCommitted; got != held {
		t.Fatalf("after op %#x: admission holds %d MiB, the records %d MiB", op, got/testMiB, held/testMiB)
	}
	if ids := p.IDs(); len(ids) != len(recs) {
		t.Fatalf("after op %#x: backend has %v, records %d", op, ids, len(recs))
	}
}

// FuzzPauseRequest sends pause and resume requests with any ID and
// selector, as a key of another project: each is refused
// (InvalidArgument, NotFound) or matches nothing, and no sandbox of the
// project that owns them is paused or resumed.
//
//	go test -run '^$' -fuzz FuzzPauseRequest -fuzztime 30s ./internal/edge/
func FuzzPauseRequest(f *testing.F) {
	f.Add("", "job", "train", true)
	f.Add("n-aaaaaaaaaaaa", "", "", false)
	f.Add("n-aaaaaaaaaaaa", "job", "train", true)
	f.Add("../../etc", "dsec.io/project", "alice", false)
	f.Add("n-\x00", "job\x00", "", true)
	f.Add("@a", "", "", true) // a real sandbox of alice by ID
	n, p := newPauseNode(f)
	e := n.openPause(p.open())
	f.Cleanup(func() { e.Close() })
	alice := Caller{Project: "alice", KeyID: "ka"}
	mallory := Caller{Project: "mallory", KeyID: "km"}
	ctx := context.Background()
	var ids []string
	for range 2 {
		r, err := e.Create(ctx, alice, CreateParams{Image: "busybox", Labels: map[string]string{"job": "train"}}, "")
		if err != nil {
			f.Fatal(err)
		}
		ids = append(ids, r.ID)
	}
	if _, err := e.Pause(ctx, alice, ids[1], nil); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id, k, v string, useID bool) {
		if useID && len(id) > 0 && id[0] == '@' {
			id = ids[int(id[len(id)-1])%len(ids)] // aim at a real one
		}
		var sel map[string]string
		if k != "" || v != "" {
			sel = map[string]string{k: v}
		}
		if !useID {
			id = ""
		}
		for _, call := range []func(context.Context, Caller, string, map[string]string) ([]PauseResult, error){e.Pause, e.Resume} {
			res, err := call(ctx, mallory, id, sel)
			switch {
			case err != nil && !errdefs.Is(err, errdefs.ErrInvalidArgument) && !errdefs.Is(err, errdefs.ErrNotFound):
				t.Fatalf("(%q, %q) = %v, want InvalidArgument or NotFound", id, sel, err)
			case err == nil && len(res) != 0:
				t.Fatalf("(%q, %q) = %+v: another project's sandboxes", id, sel, res)
			}
		}
		if state(e, ids[0]) != StateRunning || state(e, ids[1]) != StatePaused || p.count("Pause") != 1 || p.count("Resume") != 0 {
			t.Fatalf("after (%q, %q): %s, %s, %d pauses, %d resumes", id, sel, state(e, ids[0]), state(e, ids[1]), p.count("Pause"), p.count("Resume"))
		}
	})
}
