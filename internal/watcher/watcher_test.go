package watcher

import (
	"context"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
)

// lister answers ListNodes with the nodes of each call in turn; a call
// whose release channel is set waits for it.
type lister struct {
	calls chan call
}

type call struct {
	nodes   []cluster.Node
	release chan struct{}
}

func (l *lister) ListNodes(ctx context.Context) ([]cluster.Node, error) {
	c := <-l.calls
	if c.release != nil {
		<-c.release
	}
	return c.nodes, nil
}

// A poll that started before another but ended after it does not replace
// the newer view: a refused create polls while the loop's poll may be
// slow, and the older view brought back deletes the create had waited
// for (issue 13).
func TestOlderPollDoesNotWin(t *testing.T) {
	pool := edgeclient.NewPool("token")
	defer pool.Close()
	l := &lister{calls: make(chan call, 4)}
	w := &Watcher{cfg: Config{Nodes: l, Pool: pool, Interval: time.Hour}, nodes: map[string]NodeState{}}
	dir := t.TempDir()
	release := make(chan struct{})
	l.calls <- call{nodes: []cluster.Node{{Name: "old", Addr: "unix://" + dir + "/none.sock"}}, release: release}
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Poll(t.Context())
	}()
	// The slow poll has started (it took its call); now a newer one runs.
	for len(l.calls) > 0 {
		time.Sleep(time.Millisecond)
	}
	time.Sleep(10 * time.Millisecond)
	l.calls <- call{nodes: []cluster.Node{{Name: "new", Addr: "unix://" + dir + "/none.sock"}}}
	w.Poll(t.Context())
	close(release)
	<-done
	ns := w.Nodes()
	if len(ns) != 1 || ns[0].Node.Name != "new" {
		names := []string{}
		for _, n := range ns {
			names = append(names, n.Node.Name)
		}
		t.Errorf("nodes after an older poll ended last = %v, want [new] (the newer poll's view)", names)
	}
}
