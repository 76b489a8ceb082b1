package apiserver

import (
	"context"
	"net"

	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/cluster"
)

// DialPort connects to port of sandbox id, on the sandbox's own loopback,
// through the edge that owns it, as the holder of key k: the edge refuses
// (NotFound) a sandbox the key may not see before it dials anything. It is
// the way in of the ports proxy (internal/portproxy), which authenticates
// k with Authenticate.
func (s *Server) DialPort(ctx context.Context, k cluster.Key, id string, port int) (net.Conn, error) {
	conn, err := s.edgeFor(ctx, id)
	if err != nil {
		return nil, err
	}
	c, err := conn.DialPort(ctx, caller.Caller{Project: k.Project, KeyID: k.ID, Admin: k.Admin}, id, port)
	if err != nil {
		return nil, edgeErr(conn.Name, err)
	}
	return c, nil
}
