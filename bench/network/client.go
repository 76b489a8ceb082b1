//go:build linux

package main

import (
	"debug/elf"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"strconv"
	"time"
)

// The wire protocol of the benchmark's server: the client sends the number
// of bytes it wants (8 bytes, big endian; its first byte is 0, so the
// proxy's peek sees neither TLS nor HTTP and judges at once), the server
// sends that many and closes.

// maxRequest bounds what one connection may ask the server for.
const maxRequest = 1 << 36

// clientResult is what the client prints: how much it did in how long.
type clientResult struct {
	Bytes   int64   `json:"bytes,omitempty"`
	Conns   int     `json:"conns,omitempty"`
	Seconds float64 `json:"seconds"`
}

// clientMain is the benchmark's own binary run as the client, on the host
// or inside a sandbox (it is static, copied into the image):
//
//	dsec-bench-net client get ADDR BYTES   one download of BYTES
//	dsec-bench-net client conns ADDR N     N connections one after another, 1 byte each
func clientMain(args []string) {
	log.SetFlags(0)
	log.SetPrefix("bench client: ")
	if len(args) != 3 {
		log.Fatal("usage: client get ADDR BYTES | client conns ADDR N")
	}
	n, err := strconv.ParseInt(args[2], 10, 64)
	if err != nil || n < 1 || n > maxRequest {
		log.Fatalf("bad count %q", args[2])
	}
	var res clientResult
	t0 := time.Now()
	switch args[0] {
	case "get":
		res.Bytes, err = get(args[1], n)
	case "conns":
		for res.Conns = 0; res.Conns < int(n) && err == nil; res.Conns++ {
			_, err = get(args[1], 1)
		}
	default:
		log.Fatalf("unknown client command %q", args[0])
	}
	res.Seconds = time.Since(t0).Seconds()
	if err != nil {
		log.Fatal(err)
	}
	b, _ := json.Marshal(res)
	fmt.Println(string(b))
}

// get downloads n bytes from the server at addr, reading with a large
// buffer (io.Discard's ReadFrom reads 8 KiB at a time, which would make
// the client the bottleneck).
func get(addr string, n int64) (int64, error) {
	c, err := net.DialTimeout("tcp4", addr, 10*time.Second)
	if err != nil {
		return 0, err
	}
	defer c.Close()
	var req [8]byte
	binary.BigEndian.PutUint64(req[:], uint64(n))
	if _, err := c.Write(req[:]); err != nil {
		return 0, err
	}
	buf := make([]byte, 1<<20)
	var got int64
	for {
		k, err := c.Read(buf)
		got += int64(k)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return got, err
		}
	}
	if got != n {
		return got, fmt.Errorf("read %d bytes from %s, want %d", got, addr, n)
	}
	return got, nil
}

// serve answers the protocol above on ln until it is closed.
func serve(ln net.Listener) {
	zeros := make([]byte, 1<<20)
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			var req [8]byte
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			if _, err := io.ReadFull(c, req[:]); err != nil {
				return
			}
			c.SetReadDeadline(time.Time{})
			n := int64(binary.BigEndian.Uint64(req[:]))
			if n < 0 || n > maxRequest {
				return
			}
			for n > 0 {
				k, err := c.Write(zeros[:min(n, int64(len(zeros)))])
				if err != nil {
					return
				}
				n -= int64(k)
			}
		}()
	}
}

// isStatic reports whether the executable at path has no program
// interpreter (a dynamic loader), so that it runs inside a busybox image.
func isStatic(path string) (bool, error) {
	f, err := elf.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	for _, p := range f.Progs {
		if p.Type == elf.PT_INTERP {
			return false, nil
		}
	}
	return true, nil
}
