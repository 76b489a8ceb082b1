package sandbox

import (
	"io"
	"net"
	"testing"
	"time"
)

func TestParsePort(t *testing.T) {
	for _, c := range []struct {
		s    string
		want int
		ok   bool
	}{
		{"1", 1, true}, {"8080", 8080, true}, {"65535", 65535, true},
		{"", 0, false}, {"0", 0, false}, {"080", 0, false}, {"65536", 0, false}, {"99999", 0, false},
		{"+80", 0, false}, {"-1", 0, false}, {"8o", 0, false}, {"123456", 0, false}, {"８０", 0, false},
	} {
		if got, ok := ParsePort(c.s); got != c.want || ok != c.ok {
			t.Errorf("ParsePort(%q) = %d, %v; want %d, %v", c.s, got, ok, c.want, c.ok)
		}
	}
}

func TestPortTunnelPath(t *testing.T) {
	id, port, ok := ParsePortTunnelPath(PortTunnelPath("n-abc", 8080))
	if !ok || id != "n-abc" || port != 8080 {
		t.Errorf("ParsePortTunnelPath(PortTunnelPath(n-abc, 8080)) = %q, %d, %v", id, port, ok)
	}
	for _, p := range []string{
		"/dsec.node.v1.Ports/n-abc", "/dsec.node.v1.Ports/n-abc/0", "/dsec.node.v1.Ports/../8080",
		"/dsec.node.v1.Ports/n-abc/8080/x", "/dsec.node.v1.Ports/N-ABC/8080", "/other/n-abc/8080",
		"/dsec.node.v1.Ports/-abc/80",
	} {
		if id, port, ok := ParsePortTunnelPath(p); ok {
			t.Errorf("ParsePortTunnelPath(%q) = %q, %d, want refused", p, id, port)
		}
	}
}

// TestPipeHalfClose: a half close passes through, and the other direction
// still carries data until it ends too.
func TestPipeHalfClose(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	// client <-> (a | Pipe | b) <-> server
	client, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	a, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	b, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { Pipe(a, b); close(done) }()
	_ = client.SetDeadline(time.Now().Add(5 * time.Second))
	_ = server.SetDeadline(time.Now().Add(5 * time.Second))
	_, _ = io.WriteString(client, "request")
	_ = client.(*net.TCPConn).CloseWrite()
	got, err := io.ReadAll(server) // ends: the half close came through
	if string(got) != "request" || err != nil {
		t.Fatalf("server read %q, %v", got, err)
	}
	_, _ = io.WriteString(server, "answer")
	server.Close()
	got, err = io.ReadAll(client)
	if string(got) != "answer" || err != nil {
		t.Fatalf("client read %q, %v", got, err)
	}
	client.Close()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("Pipe did not return once both directions ended")
	}
}
