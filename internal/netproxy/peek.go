package netproxy

import (
	"bytes"
	"encoding/binary"
	"net/netip"
	"strings"

	"github.com/dsecproject/dsec/internal/netpolicy"
)

// peekState is what the first bytes of a connection say so far.
type peekState int

const (
	// peekMore: the bytes begin a TLS ClientHello or an HTTP request that
	// is not complete yet.
	peekMore peekState = iota
	// peekDone: the name (maybe "") is known: a complete ClientHello or
	// HTTP header, or a protocol that names nothing.
	peekDone
	// peekBad: the bytes are a TLS record or an HTTP request that cannot
	// be read (malformed, two Host headers, a name that is no host name):
	// the connection is refused rather than judged without its name.
	peekBad
)

// peekName reads the name a connection's first bytes say it is for: the
// TLS ClientHello's server_name, or the HTTP/1 Host header (without its
// port). Other protocols name nothing (peekDone with ""). An address
// literal as the name is no name.
func peekName(b []byte) (string, peekState) {
	if len(b) == 0 {
		return "", peekMore
	}
	if b[0] == 0x16 {
		return tlsServerName(b)
	}
	if looksHTTP(b) {
		return httpHost(b)
	}
	return "", peekDone
}

// httpMethods are the request methods that make a connection HTTP/1.
var httpMethods = []string{"GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE", "PROPFIND"}

// looksHTTP reports whether b is, or may become, an HTTP/1 request line.
func looksHTTP(b []byte) bool {
	for _, m := range httpMethods {
		full := m + " "
		n := min(len(b), len(full))
		if string(b[:n]) == full[:n] {
			return true
		}
	}
	return false
}

// httpHost finds the Host header of an HTTP/1 request head.
func httpHost(b []byte) (string, peekState) {
	end := bytes.Index(b, []byte("\r\n\r\n"))
	if end < 0 {
		return "", peekMore
	}
	lines := strings.Split(string(b[:end]), "\r\n")
	if len(lines) == 0 || !strings.Contains(lines[0], " HTTP/1.") && !strings.HasSuffix(lines[0], " HTTP/1") {
		return "", peekBad
	}
	host, seen := "", false
	for _, l := range lines[1:] {
		k, v, ok := strings.Cut(l, ":")
		if !ok || k == "" || strings.ContainsAny(k, " \t") {
			// A header without a colon, or with a space before it
			// (which some servers fold into another header), is
			// refused: the name must not be ambiguous.
			return "", peekBad
		}
		if !strings.EqualFold(k, "host") {
			continue
		}
		if seen {
			return "", peekBad
		}
		seen, host = true, strings.TrimSpace(v)
	}
	if !seen {
		return "", peekDone
	}
	return hostName(host)
}

// hostName takes the name of a Host value ("name", "name:port",
// "[v6]:port"); an address literal is no name.
func hostName(h string) (string, peekState) {
	if h == "" {
		return "", peekBad
	}
	if strings.HasPrefix(h, "[") {
		if _, err := netip.ParseAddrPort(h); err == nil {
			return "", peekDone
		}
		if _, err := netip.ParseAddr(strings.Trim(h, "[]")); err == nil {
			return "", peekDone
		}
		return "", peekBad
	}
	if i := strings.LastIndexByte(h, ':'); i >= 0 {
		port := h[i+1:]
		if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
			return "", peekBad
		}
		h = h[:i]
	}
	return checkedName(h)
}

// checkedName normalizes a name the connection gave; an IPv4 literal is
// no name, anything else that is not a host name is refused.
func checkedName(s string) (string, peekState) {
	if _, err := netip.ParseAddr(s); err == nil {
		return "", peekDone
	}
	n, err := netpolicy.NormalizeName(s)
	if err != nil {
		return "", peekBad
	}
	return n, peekDone
}

// tlsServerName parses a TLS ClientHello in the first record and returns
// its server_name. The ClientHello must fit in that record (16 KiB).
func tlsServerName(b []byte) (string, peekState) {
	if len(b) < 5 {
		return "", peekMore
	}
	if b[1] != 3 {
		return "", peekBad
	}
	recLen := int(binary.BigEndian.Uint16(b[3:5]))
	if recLen < 4 || recLen > 1<<14 {
		return "", peekBad
	}
	if len(b) < 5+recLen {
		return "", peekMore
	}
	r := reader(b[5 : 5+recLen])
	typ, ok := r.u8()
	if !ok || typ != 1 { // client_hello
		return "", peekBad
	}
	hsLen, ok := r.u24()
	if !ok || hsLen > len(r) {
		// A ClientHello spread over several records is not read.
		return "", peekBad
	}
	r = r[:hsLen]
	if !r.skip(2 + 32) { // legacy_version, random
		return "", peekBad
	}
	if !r.skipVec8() || !r.skipVec16() || !r.skipVec8() { // session id, suites, compression
		return "", peekBad
	}
	if len(r) == 0 {
		return "", peekDone // no extensions: no SNI
	}
	exts, ok := r.vec16()
	if !ok {
		return "", peekBad
	}
	name, seen := "", false
	for len(exts) > 0 {
		typ, ok1 := exts.u16()
		data, ok2 := exts.vec16()
		if !ok1 || !ok2 {
			return "", peekBad
		}
		if typ != 0 { // server_name
			continue
		}
		if seen {
			return "", peekBad
		}
		seen = true
		list, ok := data.vec16()
		if !ok || len(data) != 0 {
			return "", peekBad
		}
		for len(list) > 0 {
			nt, ok1 := list.u8()
			hn, ok2 := list.vec16()
			if !ok1 || !ok2 {
				return "", peekBad
			}
			if nt != 0 { // host_name
				continue
			}
			if name != "" {
				return "", peekBad
			}
			name = string(hn)
			if name == "" {
				return "", peekBad
			}
		}
	}
	if name == "" {
		return "", peekDone
	}
	return checkedName(name)
}

// reader reads TLS's big-endian fields and length-prefixed vectors.
type reader []byte

func (r *reader) u8() (int, bool) {
	if len(*r) < 1 {
		return 0, false
	}
	v := (*r)[0]
	*r = (*r)[1:]
	return int(v), true
}

func (r *reader) u16() (int, bool) {
	if len(*r) < 2 {
		return 0, false
	}
	v := binary.BigEndian.Uint16(*r)
	*r = (*r)[2:]
	return int(v), true
}

func (r *reader) u24() (int, bool) {
	if len(*r) < 3 {
		return 0, false
	}
	v := int((*r)[0])<<16 | int((*r)[1])<<8 | int((*r)[2])
	*r = (*r)[3:]
	return v, true
}

func (r *reader) skip(n int) bool {
	if len(*r) < n {
		return false
	}
	*r = (*r)[n:]
	return true
}

func (r *reader) bytes(n int) (reader, bool) {
	if len(*r) < n {
		return nil, false
	}
	v := (*r)[:n]
	*r = (*r)[n:]
	return v, true
}

func (r *reader) vec16() (reader, bool) {
	n, ok := r.u16()
	if !ok {
		return nil, false
	}
	return r.bytes(n)
}

func (r *reader) skipVec8() bool {
	n, ok := r.u8()
	return ok && r.skip(n)
}

func (r *reader) skipVec16() bool {
	n, ok := r.u16()
	return ok && r.skip(n)
}
