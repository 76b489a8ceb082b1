package netproxy

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestHTTP1EveryRequestJudged: on a kept-alive plain HTTP connection to an
// allowed name's address, each request's Host is judged: a later request
// for a name the policy denies (other.test, at the same address) is
// refused and never reaches the server, whatever came before it (a body
// with a fixed length or chunked, holding something that looks like a
// request), and requests that would make the proxy and the server read
// the stream differently are refused.
func TestHTTP1EveryRequestJudged(t *testing.T) {
	n := newTestNode(t)
	ns, gw := n.attach(t, "sb-a", "allow=mirror")
	if _, err := lookup(t, ns, gw.String()+":53", "allowed.test"); err != nil {
		t.Fatal(err)
	}
	addr := fmt.Sprintf("%s:%d", allowedIP, n.echo.port())
	req := func(host, headers, body string) string {
		return "POST /x HTTP/1.1\r\nHost: " + host + "\r\n" + headers + "\r\n" + body
	}
	inner := "GET / HTTP/1.1\r\nHost: other.test\r\n\r\n"
	chunked := fmt.Sprintf("%x\r\n%s\r\n0\r\n\r\n", len(inner), inner)
	for _, tt := range []struct {
		name    string
		allowed []string // echoed, in order
		denied  string   // then refused; "" when none is
	}{
		{"two allowed", []string{req("allowed.test", "Content-Length: 0\r\n", ""), req("allowed.test:80", "", "")}, ""},
		{"then another name", []string{req("allowed.test", "", "")}, req("other.test", "", "")},
		{"a request inside a fixed-length body", []string{req("allowed.test", fmt.Sprintf("Content-Length: %d\r\n", len(inner)), inner)}, req("other.test", "", "")},
		{"a request inside a chunked body", []string{req("allowed.test", "Transfer-Encoding: chunked\r\n", chunked)}, req("denied.test", "", "")},
		{"length and chunked", []string{req("allowed.test", "", "")}, req("allowed.test", "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n", "0\r\n\r\n")},
		{"two lengths", []string{req("allowed.test", "", "")}, req("allowed.test", "Content-Length: 1\r\nContent-Length: 2\r\n", "ab")},
		{"another coding", []string{req("allowed.test", "", "")}, req("allowed.test", "Transfer-Encoding: gzip, chunked\r\n", "0\r\n\r\n")},
		// A request without a Host is judged by the names resolved, as a
		// connection's first is.
		{"no name", []string{req("allowed.test", "", ""), "GET / HTTP/1.1\r\n\r\n"}, ""},
		{"not HTTP", []string{req("allowed.test", "", "")}, "SSH-2.0-x\r\n\r\n"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			c, err := ns.dial("tcp4", addr, time.Second)
			if err != nil {
				t.Fatal(err)
			}
			defer c.Close()
			for i, r := range tt.allowed {
				if err := roundTrip(c, []byte(r)); err != nil {
					t.Fatalf("request %d (%.40q): %v, want it echoed", i, r, err)
				}
			}
			if tt.denied == "" {
				return
			}
			err = roundTrip(c, []byte(tt.denied))
			if err == nil {
				t.Fatalf("request %.60q after %d allowed: echoed, want refused", tt.denied, len(tt.allowed))
			}
		})
	}
	st, _ := n.Stats("sb-a")
	var reasons []string
	for _, d := range st.Denials {
		reasons = append(reasons, d.Name+": "+d.Reason)
	}
	if len(st.Denials) < 7 || !strings.Contains(strings.Join(reasons, "\n"), "other.test: denied") {
		t.Errorf("denials recorded: %q; want one for each refused request, other.test's named", reasons)
	}
}
