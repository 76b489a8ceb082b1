package main

import (
	"net"
	"strings"
	"testing"
)

func TestPortUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"port", "sbx"}, "accepts 2 arg"},
		{[]string{"port", "sbx", "http"}, `port "http"`},
		{[]string{"port", "sbx", "0"}, `port "0"`},
		{[]string{"port", "sbx", "70000"}, `port "70000"`},
		{[]string{"port", "sbx", "80", "--ports-addr", "ftp://x"}, "--ports-addr"},
	} {
		_, errOut, code := dsecRun(t, "http://127.0.0.1:1", "", c.args...)
		if code != 2 || !strings.Contains(errOut, c.want) {
			t.Errorf("dsec %v = %q, exit %d; want exit 2 naming %s", c.args, errOut, code, c.want)
		}
	}
}

// TestPortProxyDown: a proxy that does not answer is named, with the flag
// that points at it, and the local connection is closed.
func TestPortProxyDown(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := ln.Addr().String()
	ln.Close()
	u, err := portsBase(dead, "http://127.0.0.1:7420")
	if err != nil {
		t.Fatal(err)
	}
	fw := &portForwarder{base: u, key: "k", id: "sbx", port: 80}
	if _, err := fw.dial(t.Context()); err == nil || !strings.Contains(err.Error(), "--ports-addr") {
		t.Errorf("dial of a dead proxy = %v, want an error naming --ports-addr", err)
	}
	if u, _ := portsBase("", "https://api.example:7420"); u.String() != "https://api.example:7422" {
		t.Errorf("default ports address = %s, want the API's host on 7422", u)
	}
}
