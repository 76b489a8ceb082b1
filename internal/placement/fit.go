package placement

import "slices"

// Misfit says why no node could ever take a request, however many
// sandboxes are deleted: Resource ("memory", "pids" or "disk") asks for
// more than Most, the most any node gives one sandbox (on Node). An empty
// Resource means each is given by some node, but no node gives them all.
type Misfit struct {
	Resource string
	Most     int64
	Node     string
}

// Never reports why none of the healthy nodes that run req's backend could
// ever take req, and false when one could, when none runs the backend, or
// when a node's report does not say (waiting for it may help).
func Never(nodes []Node, req Request) (Misfit, bool) {
	var cands []Node
	for _, n := range nodes {
		if !n.Healthy || !slices.Contains(n.Backends, req.Backend) {
			continue
		}
		if n.MemoryAdmissible <= 0 || everFits(n, req) {
			return Misfit{}, false
		}
		cands = append(cands, n)
	}
	if len(cands) == 0 {
		return Misfit{}, false
	}
	for _, r := range []struct {
		name string
		want int64
		most func(Node) int64
	}{
		{"memory", req.MemoryBytes, mostMemory},
		{"pids", req.Pids, func(n Node) int64 { return n.PidsMax }},
		{"disk", req.DiskBytes, func(n Node) int64 { return n.DiskMaxBytes }},
	} {
		m := Misfit{Resource: r.name}
		known := true
		for _, n := range cands {
			most := r.most(n)
			known = known && most > 0
			if most > m.Most {
				m.Most, m.Node = most, n.Name
			}
		}
		if known && r.want > m.Most {
			return m, true
		}
	}
	return Misfit{}, true
}

// mostMemory is the most memory node n admits for one sandbox: what all
// its sandboxes together may hold, and no more than its memory for them.
func mostMemory(n Node) int64 {
	if n.MemoryBytes > 0 {
		return min(n.MemoryAdmissible, n.MemoryBytes)
	}
	return n.MemoryAdmissible
}

// everFits reports whether n could take req once it has room: what it
// does not report is taken to fit.
func everFits(n Node, req Request) bool {
	fits := func(want, most int64) bool { return most <= 0 || want <= most }
	return fits(req.MemoryBytes, mostMemory(n)) && fits(req.Pids, n.PidsMax) && fits(req.DiskBytes, n.DiskMaxBytes)
}
