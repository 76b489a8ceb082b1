package netdns

import (
	"context"
	"testing"

	"github.com/miekg/dns"
)

// BenchmarkAnswerCached measures one cached A answer, wire to wire,
// without sockets.
func BenchmarkAnswerCached(b *testing.B) {
	up := newUpstream(b)
	r, err := New(Config{Upstreams: []string{up.addr}, Rate: 1e12, Burst: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	m := new(dns.Msg)
	m.SetQuestion("pypi.test.", dns.TypeA)
	q, _ := m.Pack()
	sb := Sandbox{ID: "bench", Policy: testPolicy}
	ctx := context.Background()
	if resp := r.Answer(ctx, sb, q, true); resp == nil {
		b.Fatal("no reply")
	}
	b.ReportAllocs()
	for b.Loop() {
		r.Answer(ctx, sb, q, true)
	}
}
