//go:build linux

package main

import (
	"net"
	"testing"
)

// TestGet: the client gets what it asked for from the server, and a
// server that sends less is an error, not a fast download.
func TestGet(t *testing.T) {
	ln, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go serve(ln)
	if n, err := get(ln.Addr().String(), 3<<20+1); err != nil || n != 3<<20+1 {
		t.Fatalf("get = %d, %v; want %d", n, err, 3<<20+1)
	}

	short, err := net.Listen("tcp4", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer short.Close()
	go func() {
		c, err := short.Accept()
		if err != nil {
			return
		}
		c.Write(make([]byte, 100))
		c.Close()
	}()
	if n, err := get(short.Addr().String(), 1000); err == nil {
		t.Errorf("get from a server that sends 100 of 1000 bytes = %d, nil; want an error", n)
	}
}

func TestRates(t *testing.T) {
	r := newRate("x", "MB/s", []float64{4, 1, 3, 2})
	if r.Median != 2.5 || r.Min != 1 || r.Max != 4 {
		t.Errorf("newRate = %+v, want median 2.5, min 1, max 4", r)
	}
	if r := newRate("x", "MB/s", []float64{5, 1, 3}); r.Median != 3 {
		t.Errorf("median of 5 1 3 = %v, want 3", r.Median)
	}
	// Two clients of 100 connections, the slower in 2 s: 100 a second.
	if got := connRate([]clientResult{{Conns: 100, Seconds: 1}, {Conns: 100, Seconds: 2}}); got != 100 {
		t.Errorf("connRate = %v, want 100", got)
	}
}
