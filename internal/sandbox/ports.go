package sandbox

import (
	"bufio"
	"io"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"
)

// PortLoginRequest is the body of the ports proxy's POST /_dsec/v1/login
// (internal/portproxy), which an API key authenticates.
type PortLoginRequest struct {
	Sandbox string `json:"sandbox"`
	Port    int    `json:"port"`
}

// PortLoginResponse is its answer: a link that logs a browser in to the
// host form of the sandbox's port, once, before it expires.
type PortLoginResponse struct {
	URL       string    `json:"url"`
	ExpiresAt time.Time `json:"expires_at"`
}

// The node API's port tunnel: the control plane asks the edge that owns a
// sandbox for a byte stream to one of its ports with an HTTP/1.1 request
// GET PortTunnelPath(id, port) carrying "Connection: Upgrade" and
// "Upgrade: PortTunnelUpgrade" (and the node token and caller headers of
// every node API call). The edge answers 101 and the connection is then
// the TCP stream to the port, or it answers an error status whose header
// HeaderErrorCode carries the error's API code (as connect names it) and
// whose body is the error's message.
const (
	portTunnelPrefix  = "/dsec.node.v1.Ports/"
	PortTunnelUpgrade = "dsec-tcp"
	HeaderErrorCode   = "Dsec-Error-Code"
)

// PortTunnelPattern is the ServeMux pattern of port tunnels.
const PortTunnelPattern = "GET " + portTunnelPrefix

// PortTunnelPath is the node API path of a tunnel to port of sandbox id.
func PortTunnelPath(id string, port int) string {
	return portTunnelPrefix + id + "/" + strconv.Itoa(port)
}

// ParsePortTunnelPath is the inverse of PortTunnelPath.
func ParsePortTunnelPath(p string) (id string, port int, ok bool) {
	rest, ok := strings.CutPrefix(p, portTunnelPrefix)
	if !ok {
		return "", 0, false
	}
	id, ps, ok := strings.Cut(rest, "/")
	if !ok || !ValidID(id) {
		return "", 0, false
	}
	port, ok = ParsePort(ps)
	return id, port, ok
}

// ValidID reports whether s has the form of a sandbox ID: a DNS label of
// lowercase letters, digits and dashes, at most 63 characters.
func ValidID(s string) bool {
	if s == "" || len(s) > 63 || s[0] == '-' || s[len(s)-1] == '-' {
		return false
	}
	for _, c := range []byte(s) {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return false
		}
	}
	return true
}

// ParsePort parses a TCP port number, 1-65535, in decimal without sign or
// leading zeros.
func ParsePort(s string) (int, bool) {
	if s == "" || len(s) > 5 || s[0] == '0' {
		return 0, false
	}
	n := 0
	for _, c := range []byte(s) {
		if c < '0' || c > '9' {
			return 0, false
		}
		n = n*10 + int(c-'0')
	}
	if n < 1 || n > 65535 {
		return 0, false
	}
	return n, true
}

// Pipe copies a to b and b to a until both directions ended, passing on a
// half close (CloseWrite) where the connection has one, then closes both.
func Pipe(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Add(2)
	one := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if cw, ok := dst.(interface{ CloseWrite() error }); ok && err == nil {
			_ = cw.CloseWrite()
			return
		}
		// An error, or no half close: end both directions.
		_ = dst.Close()
		_ = src.Close()
	}
	go one(a, b)
	go one(b, a)
	wg.Wait()
	_ = a.Close()
	_ = b.Close()
}

// BufferedConn returns c reading first what r buffered of it (a hijacked
// or just upgraded HTTP connection), with c's half close.
func BufferedConn(c net.Conn, r *bufio.Reader) net.Conn {
	if r == nil || r.Buffered() == 0 {
		return c
	}
	return &bufferedConn{Conn: c, r: r}
}

type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

func (c *bufferedConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}
