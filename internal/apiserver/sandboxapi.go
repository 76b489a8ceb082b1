package apiserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/caller"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
)

// The API for sandboxes (the built-in service dsec-api, docs/network.md).
// dsec up serves it on a Unix socket only root can open, which the node's
// egress proxy connects to for a sandbox whose policy allows dsec-api,
// writing a preamble that names the sandbox (netpolicy.SandboxAPIPreamble)
// before the sandbox's own bytes. Every call on such a connection is the
// sandbox's: its key is the sandbox's own (its project's, never an admin's,
// whatever Authorization header it sends), and it can do less than a
// user's key: no network policy changes (its own or any other's), no
// sandbox with a network, no image or key management, and no pause.
//
// Why no pause, while resume is allowed: pausing is the trainer's (when
// its GPU job is preempted), not an agent's. A sandbox that paused itself
// would freeze the very process waiting for the answer, and nothing of it
// could resume it; one that paused the other sandboxes of its project (a
// selector is a job) would have the node push their memory out to swap and
// back for every request that then resumes them: untrusted code making
// the node's memory and disk do its bidding, for every project on the
// node. A resume is what any request to a paused sandbox does first
// anyway (an exec of the sandbox's key into another resumes it), so
// refusing it would protect nothing.

// SandboxListener wraps ln, the API-for-sandboxes socket: each
// connection's preamble is read, within bounds, before its first request.
func SandboxListener(ln net.Listener) net.Listener { return sandboxListener{ln} }

type sandboxListener struct{ net.Listener }

func (l sandboxListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &sandboxConn{Conn: c}, nil
}

// preambleTimeout bounds the wait for a connection's preamble (the proxy
// writes it at once).
const preambleTimeout = 5 * time.Second

// sandboxConn is a connection of the API for sandboxes.
type sandboxConn struct {
	net.Conn
	once sync.Once
	id   string
	err  error

	keyMu sync.Mutex
	key   *cluster.Key // guarded by keyMu; the sandbox's, once looked up
}

// Read reads the preamble first, in the connection's own goroutine.
func (c *sandboxConn) Read(p []byte) (int, error) {
	c.once.Do(c.readPreamble)
	if c.err != nil {
		return 0, c.err
	}
	return c.Conn.Read(p)
}

func (c *sandboxConn) readPreamble() {
	_ = c.Conn.SetReadDeadline(time.Now().Add(preambleTimeout))
	defer c.Conn.SetReadDeadline(time.Time{})
	line := make([]byte, 0, netpolicy.MaxAPIPreamble)
	b := make([]byte, 1)
	for len(line) < netpolicy.MaxAPIPreamble {
		if _, err := c.Conn.Read(b); err != nil {
			c.err = fmt.Errorf("sandbox API: read the preamble: %w", err)
			return
		}
		line = append(line, b[0])
		if b[0] == '\n' {
			c.id, c.err = netpolicy.ParseSandboxAPIPreamble(line)
			return
		}
	}
	c.err = errors.New("sandbox API: the preamble is too long")
}

type sandboxConnKey struct{}

// SandboxConnContext is the http.Server ConnContext of the API for
// sandboxes: it marks the requests of each connection as its sandbox's.
func SandboxConnContext(ctx context.Context, c net.Conn) context.Context {
	if sc, ok := c.(*sandboxConn); ok {
		return context.WithValue(ctx, sandboxConnKey{}, sc)
	}
	return ctx
}

// sandboxKey returns the key of the sandbox whose connection ctx's
// request came on, looked up once per connection: the sandbox must exist
// and run.
func (s *Server) sandboxKey(ctx context.Context, sc *sandboxConn) (cluster.Key, error) {
	sc.keyMu.Lock()
	defer sc.keyMu.Unlock()
	if sc.key != nil {
		return *sc.key, nil
	}
	if sc.err != nil || sc.id == "" {
		return cluster.Key{}, errdefs.Newf(errdefs.ErrUnauthenticated, "not a sandbox's connection")
	}
	conn, err := s.edgeFor(ctx, sc.id)
	if err != nil {
		return cluster.Key{}, err
	}
	req := connect.NewRequest(&sandboxv1.GetRequest{Id: sc.id})
	caller.Caller{Admin: true, KeyID: "dsec-api"}.SetHeader(req.Header())
	resp, err := conn.Sandbox.Get(ctx, req)
	if err != nil {
		return cluster.Key{}, edgeErr(conn.Name, err)
	}
	sb := resp.Msg.GetSandbox()
	if sb.GetState() != sandboxv1.State_STATE_RUNNING {
		return cluster.Key{}, errdefs.Newf(errdefs.ErrUnauthenticated, "sandbox %s is not running", sc.id)
	}
	k := cluster.Key{ID: "sandbox", Name: "sandbox " + sc.id, Project: sb.GetProject(), Sandbox: sc.id, Rollout: sb.GetRollout()}
	sc.key = &k
	return k, nil
}

// sandboxDenied are the calls a sandbox's key may not make, with why.
var sandboxDenied = map[string]string{
	"/dsec.sandbox.v1.SandboxService/UpdateNetwork": "change network policies",
	"/dsec.sandbox.v1.SandboxService/PackDiff":      "make images",
	"/dsec.sandbox.v1.SandboxService/Pause":         "pause sandboxes",
	"/dsec.image.v1.ImageService/UploadLayer":       "upload layers",
	"/dsec.image.v1.ImageService/CreateImage":       "create images",
	"/dsec.image.v1.ImageService/DeleteImage":       "delete images",
	"/dsec.image.v1.ImageService/SetImagePublic":    "publish images",
	"/dsec.image.v1.ImageService/GarbageCollect":    "collect garbage",
	"/dsec.admin.v1.AdminService/CreateKey":         "create keys",
	"/dsec.admin.v1.AdminService/ListKeys":          "list keys",
	"/dsec.admin.v1.AdminService/RevokeKey":         "revoke keys",
	"/dsec.admin.v1.AdminService/SetProjectLimits":  "set project limits",
	"/dsec.admin.v1.AdminService/ListProjects":      "list projects",
}

// memberAllowed are the only calls a rollout member's own key may make:
// exec and file operations on its rollout's members (the edge shows it
// those only), reading them and its rollout, its rollout's status, and
// who it is. The rollout calls check the ID too (rollout.go).
var memberAllowed = map[string]bool{
	"/dsec.sandbox.v1.SandboxService/Get":           true,
	"/dsec.sandbox.v1.SandboxService/Exec":          true,
	"/dsec.sandbox.v1.SandboxService/Attach":        true,
	"/dsec.sandbox.v1.SandboxService/WriteStdin":    true,
	"/dsec.sandbox.v1.SandboxService/Signal":        true,
	"/dsec.sandbox.v1.SandboxService/ResizeTTY":     true,
	"/dsec.sandbox.v1.SandboxService/ListExecs":     true,
	"/dsec.sandbox.v1.SandboxService/ListSessions":  true,
	"/dsec.sandbox.v1.SandboxService/DeleteSession": true,
	"/dsec.sandbox.v1.SandboxService/ReadFile":      true,
	"/dsec.sandbox.v1.SandboxService/WriteFile":     true,
	"/dsec.sandbox.v1.SandboxService/Stat":          true,
	"/dsec.sandbox.v1.SandboxService/ListDir":       true,
	"/dsec.sandbox.v1.SandboxService/MakeDir":       true,
	"/dsec.sandbox.v1.SandboxService/Remove":        true,
	"/dsec.sandbox.v1.SandboxService/Rename":        true,
	"/dsec.sandbox.v1.SandboxService/DownloadTar":   true,
	"/dsec.sandbox.v1.SandboxService/UploadTar":     true,
	"/dsec.rollout.v1.RolloutService/Get":           true,
	"/dsec.rollout.v1.RolloutService/SetStatus":     true,
	"/dsec.admin.v1.AdminService/WhoAmI":            true,
}

// sandboxGuard is the interceptor of the API for sandboxes: it refuses
// the calls of sandboxDenied, and for a rollout member's key every call
// memberAllowed does not name (after authentication, which made the key
// the sandbox's).
type sandboxGuard struct{}

func (sandboxGuard) check(procedure string) error {
	if what, ok := sandboxDenied[procedure]; ok {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "a sandbox's own key (dsec-api) cannot %s: ask whoever runs the sandbox", what)
	}
	return nil
}

// checkMember refuses a rollout member's key the calls memberAllowed
// does not name.
func (sandboxGuard) checkMember(ctx context.Context, procedure string) error {
	if k := keyFrom(ctx); k.Rollout != "" && !memberAllowed[procedure] {
		return errdefs.Newf(errdefs.ErrPermissionDenied,
			"the own key (dsec-api) of rollout %s's member %s acts only on its rollout: exec and files in its members, Get and SetStatus of the rollout, not %s",
			k.Rollout, k.Sandbox, procedure)
	}
	return nil
}

func (g sandboxGuard) WrapUnary(next connect.UnaryFunc) connect.UnaryFunc {
	return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
		if err := g.check(req.Spec().Procedure); err != nil {
			return nil, err
		}
		if err := g.checkMember(ctx, req.Spec().Procedure); err != nil {
			return nil, err
		}
		return next(ctx, req)
	}
}

func (sandboxGuard) WrapStreamingClient(next connect.StreamingClientFunc) connect.StreamingClientFunc {
	return next
}

func (g sandboxGuard) WrapStreamingHandler(next connect.StreamingHandlerFunc) connect.StreamingHandlerFunc {
	return func(ctx context.Context, conn connect.StreamingHandlerConn) error {
		if err := g.check(conn.Spec().Procedure); err != nil {
			return err
		}
		if err := g.checkMember(ctx, conn.Spec().Procedure); err != nil {
			return err
		}
		return next(ctx, conn)
	}
}

// checkSandboxCreate refuses a network on a sandbox a sandbox's key
// creates: its policy would be the creator's way around its own.
func checkSandboxCreate(ctx context.Context, msg *sandboxv1.CreateRequest) error {
	k := keyFrom(ctx)
	if k.Sandbox == "" {
		return nil
	}
	// Any policy but none, as written, is refused (its rules are the
	// edge's to read).
	n := msg.GetNetwork()
	if n != nil && (len(n.GetRules()) > 0 || n.GetMode() != "" && n.GetMode() != "none" || n.GetText() != "" && n.GetText() != "none") {
		return errdefs.Newf(errdefs.ErrPermissionDenied, "a sandbox's own key (dsec-api) creates sandboxes without network: drop the network policy (sandbox %s asked for one)", k.Sandbox)
	}
	return nil
}

// SandboxHandler returns the handler of the API for sandboxes: the API's
// services with the sandbox's key and sandboxGuard, /healthz, no metrics.
func (s *Server) SandboxHandler() http.Handler { return s.handler(true) }
