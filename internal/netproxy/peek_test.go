package netproxy

import (
	"crypto/tls"
	"io"
	"net"
	"testing"
)

// hello returns the ClientHello crypto/tls sends for serverName ("" sends
// no SNI).
func hello(t testing.TB, serverName string) []byte {
	t.Helper()
	a, b := net.Pipe()
	go func() {
		tls.Client(a, &tls.Config{ServerName: serverName, InsecureSkipVerify: true}).Handshake()
		a.Close()
	}()
	defer b.Close()
	head := make([]byte, 5)
	if _, err := io.ReadFull(b, head); err != nil {
		t.Fatal(err)
	}
	rest := make([]byte, int(head[3])<<8|int(head[4]))
	if _, err := io.ReadFull(b, rest); err != nil {
		t.Fatal(err)
	}
	return append(head, rest...)
}

func TestPeekName(t *testing.T) {
	h := hello(t, "PyPI.org")
	noSNI := hello(t, "")
	tests := []struct {
		name  string
		in    []byte
		want  string
		state peekState
	}{
		{"empty", nil, "", peekMore},
		{"tls", h, "pypi.org", peekDone},
		{"tls partial", h[:len(h)-1], "", peekMore},
		{"tls header only", h[:5], "", peekMore},
		{"tls no sni", noSNI, "", peekDone},
		{"tls bad version", append([]byte{0x16, 2}, h[2:]...), "", peekBad},
		{"tls not a hello", append(append([]byte{}, h[:5]...), append([]byte{2}, h[6:]...)...), "", peekBad},
		{"http", []byte("GET / HTTP/1.1\r\nHost: Files.PythonHosted.org:443\r\nUser-Agent: x\r\n\r\n"), "files.pythonhosted.org", peekDone},
		{"http lower-case header", []byte("POST /x HTTP/1.1\r\nhost: a.example\r\n\r\nbody"), "a.example", peekDone},
		{"http partial", []byte("GET / HTTP/1.1\r\nHost: a.example\r\n"), "", peekMore},
		{"http method partial", []byte("GE"), "", peekMore},
		{"http two hosts", []byte("GET / HTTP/1.1\r\nHost: a.example\r\nHost: b.example\r\n\r\n"), "", peekBad},
		{"http space before colon", []byte("GET / HTTP/1.1\r\nHost : a.example\r\n\r\n"), "", peekBad},
		{"http folded", []byte("GET / HTTP/1.1\r\nX: y\r\n Host: a.example\r\n\r\n"), "", peekBad},
		{"http no host", []byte("GET / HTTP/1.0\r\n\r\n"), "", peekDone},
		{"http ip host", []byte("GET / HTTP/1.1\r\nHost: 192.0.2.1:80\r\n\r\n"), "", peekDone},
		{"http v6 host", []byte("GET / HTTP/1.1\r\nHost: [2001:db8::1]:80\r\n\r\n"), "", peekDone},
		{"http bad name", []byte("GET / HTTP/1.1\r\nHost: a_b!.example\r\n\r\n"), "", peekBad},
		{"http bad port", []byte("GET / HTTP/1.1\r\nHost: a.example:x\r\n\r\n"), "", peekBad},
		{"http nul in name", []byte("GET / HTTP/1.1\r\nHost: a.example\x00.evil\r\n\r\n"), "", peekBad},
		{"http not http/1", []byte("GET / SPDY\r\nHost: a.example\r\n\r\n"), "", peekBad},
		{"ssh", []byte("SSH-2.0-OpenSSH_9.6\r\n"), "", peekDone},
		{"binary", []byte{0, 1, 2}, "", peekDone},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, st := peekName(tt.in)
			if got != tt.want || st != tt.state {
				t.Errorf("peekName(%.40q) = %q, %v; want %q, %v", tt.in, got, st, tt.want, tt.state)
			}
		})
	}
}

// FuzzPeekName: arbitrary first bytes never panic, a name is only given
// when complete, and a name given is a normalized host name.
func FuzzPeekName(f *testing.F) {
	f.Add(hello(f, "pypi.org"))
	f.Add([]byte("GET / HTTP/1.1\r\nHost: a.example\r\n\r\n"))
	f.Add([]byte{0x16, 3, 1, 0, 4, 1, 0, 0, 0})
	f.Fuzz(func(t *testing.T, b []byte) {
		name, st := peekName(b)
		if name != "" && st != peekDone {
			t.Fatalf("peekName(%q) = %q with state %v", b, name, st)
		}
		if name != "" {
			if n, st := checkedName(name); n != name || st != peekDone {
				t.Fatalf("peekName(%q) = %q, not a normalized name", b, name)
			}
		}
	})
}
