package netdns

import (
	"context"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzAnswer feeds arbitrary bytes as a sandbox's query: the resolver
// never panics, replies only with parseable messages, and never asks the
// upstream about a name the policy denies.
func FuzzAnswer(f *testing.F) {
	pack := func(name string, qtype, class uint16, mod func(*dns.Msg)) []byte {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		m.Question[0].Qclass = class
		if mod != nil {
			mod(m)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		return b
	}
	none := func(*dns.Msg) {}
	f.Add(pack("x.allowed.test.", dns.TypeA, dns.ClassINET, nil))
	f.Add(pack("allowed.test.", dns.TypeAAAA, dns.ClassINET, func(m *dns.Msg) { m.SetEdns0(4096, true) }))
	f.Add(pack("denied.test.", dns.TypeA, dns.ClassINET, none))
	f.Add(pack(`x\.allowed.test.`, dns.TypeA, dns.ClassINET, none))
	f.Add(pack("allowed.test.", dns.TypeANY, dns.ClassINET, none))
	f.Add(pack("allowed.test.", dns.TypeA, dns.ClassCHAOS, none))
	f.Add(pack("allowed.test.", dns.TypeA, dns.ClassINET, func(m *dns.Msg) { m.Opcode = dns.OpcodeUpdate }))
	f.Add(pack("allowed.test.", dns.TypeA, dns.ClassINET, func(m *dns.Msg) { m.Response = true }))
	f.Add([]byte{})
	f.Add([]byte{0, 1, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1}) // a name pointing at itself

	up := newUpstream(f)
	r, err := New(Config{Upstreams: []string{up.addr}, Timeout: 100 * time.Millisecond, Rate: 1e9, Burst: 1e9, MaxResolved: 64, CacheSize: 64})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(r.Close)
	policy := suffixPolicy{"allowed.test"}
	sb := Sandbox{ID: "fuzz", Policy: policy}

	f.Fuzz(func(t *testing.T, query []byte) {
		for _, udp := range []bool{true, false} {
			b := r.Answer(context.Background(), sb, query, udp)
			if b == nil {
				continue
			}
			resp := new(dns.Msg)
			if err := resp.Unpack(b); err != nil {
				t.Fatalf("reply does not parse: %v", err)
			}
			if udp && len(b) > ednsSize {
				t.Fatalf("UDP reply of %d bytes, want at most %d", len(b), ednsSize)
			}
			if len(resp.Question) == 1 {
				if name, ok := canonical(resp.Question[0].Name); (!ok || !policy.AllowName(name)) && len(resp.Answer) > 0 {
					t.Fatalf("reply to denied %q has answers: %v", resp.Question[0].Name, resp.Answer)
				}
			}
		}
		for _, n := range up.names() {
			if !policy.AllowName(n) {
				t.Fatalf("upstream was asked about denied %q", n)
			}
		}
	})
}
