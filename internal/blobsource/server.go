package blobsource

import (
	"errors"
	"net/http"
	"time"
)

// ServerOptions configures NewServer. The zero value serves without
// authentication, rate cap or added latency.
type ServerOptions struct {
	// Token, when set, is required as "Authorization: Bearer <Token>".
	Token string
	// Rate caps the bytes per second sent, shared by all requests (one
	// token bucket); 0 means no cap.
	Rate int64
	// Latency is added before each response, to simulate remote storage.
	Latency time.Duration
}

// Server serves a blob store directory read-only over HTTP: GET and HEAD
// of /blobs/sha256/<hex> and /blobs/sha256:<hex> (also under any
// /v2/<repo> prefix), with Range requests, ETags and
// immutable caching headers. It is the handler of dsec blobserver.
type Server struct {
	dir  string
	opts ServerOptions
}

var _ http.Handler = (*Server)(nil)

// NewServer returns a Server for the blob store at root.
func NewServer(root string, opts ServerOptions) (*Server, error) {
	return nil, errors.ErrUnsupported
}

// ServeHTTP implements http.Handler.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	http.Error(w, "not implemented", http.StatusNotImplemented)
}
