package placement

import "slices"

// Largest is the largest memory limit one sandbox can ever have on the
// healthy nodes that run a backend, and where.
type Largest struct {
	// MemoryBytes is the most a node admits for one sandbox: what all its
	// sandboxes together may hold (MemoryAdmissible), and no more than
	// its memory for sandboxes (MemoryBytes).
	MemoryBytes int64
	Node        string
	// Known is false when some node's report does not say: waiting for it
	// may help.
	Known bool
	// Nodes is how many healthy nodes run the backend.
	Nodes int
}

// LargestFit reports the largest memory limit a sandbox of backend can
// ever be admitted with on one of nodes, however many sandboxes are
// deleted: a request above it can never be placed, one below it may once
// there is room.
func LargestFit(nodes []Node, backend string) Largest {
	l := Largest{Known: true}
	for _, n := range nodes {
		if !n.Healthy || !slices.Contains(n.Backends, backend) {
			continue
		}
		l.Nodes++
		if n.MemoryAdmissible <= 0 {
			l.Known = false
			continue
		}
		most := n.MemoryAdmissible
		if n.MemoryBytes > 0 {
			most = min(most, n.MemoryBytes)
		}
		if most > l.MemoryBytes {
			l.MemoryBytes, l.Node = most, n.Name
		}
	}
	return l
}
