package netproxy

import (
	"bufio"
	"bytes"
	"io"
	"testing"
)

// FuzzHTTP1Stream reads arbitrary client bytes as the gate does (heads,
// framing, bodies) and checks that it never panics, never passes on more
// than it read, and never takes a head longer than its bound.
func FuzzHTTP1Stream(f *testing.F) {
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\nabGET / HTTP/1.1\r\nHost: b\r\n\r\n"))
	f.Add([]byte("POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\n\r\n2;x=y\r\nab\r\n0\r\nT: 1\r\n\r\n"))
	f.Add([]byte("\r\nGET / HTTP/1.1\r\nUpgrade: websocket\r\n\r\nanything"))
	f.Fuzz(func(t *testing.T, b []byte) {
		const max = 512
		r := bufio.NewReaderSize(bytes.NewReader(b), 64)
		var out bytes.Buffer
		for range 64 {
			head, err := readHead(r, max)
			if len(head) > max {
				t.Fatalf("a head of %d bytes passed the bound of %d", len(head), max)
			}
			if err != nil {
				break
			}
			httpHost(head)
			fr, err := framing(head)
			if err != nil {
				break
			}
			out.Write(head)
			if fr.opaque {
				break
			}
			if fr.chunked {
				if _, err := copyChunked(&out, r); err != nil {
					break
				}
			} else if fr.length > 0 {
				if _, err := out.ReadFrom(&limited{r, fr.length}); err != nil {
					break
				}
			}
		}
		if out.Len() > len(b) {
			t.Fatalf("passed on %d bytes of %d read", out.Len(), len(b))
		}
	})
}

type limited struct {
	r *bufio.Reader
	n int64
}

func (l *limited) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	p = p[:min(int64(len(p)), l.n)]
	n, err := l.r.Read(p)
	l.n -= int64(n)
	return n, err
}
