package netdns

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// fakeUpstream is a real DNS server on loopback (UDP and TCP on one port)
// serving fixed records, counting the questions it gets.
type fakeUpstream struct {
	addr string

	mu sync.Mutex
	// guarded by mu
	asked map[string]int // "name type transport" -> queries
}

// Records of the fake upstream. Addresses outside the documentation
// ranges stand in for public ones.
var upstreamRecords = map[string][]string{
	"pypi.test.":            {"pypi.test. 60 IN A 93.184.216.34", "pypi.test. 60 IN AAAA 2606:2800:220:1::1"},
	"short.test.":           {"short.test. 1 IN A 93.184.216.36"},
	"long.test.":            {"long.test. 86400 IN A 93.184.216.37"},
	"rebind.test.":          {"rebind.test. 60 IN A 10.0.0.5", "rebind.test. 60 IN A 93.184.216.35"},
	"rebind-only.test.":     {"rebind-only.test. 60 IN A 10.0.0.5"},
	"meta.test.":            {"meta.test. 60 IN A 169.254.169.254"},
	"mapped.test.":          {"mapped.test. 60 IN AAAA ::ffff:10.0.0.5", "mapped.test. 60 IN AAAA fd00::1", "mapped.test. 60 IN AAAA 64:ff9b::a00:5"},
	"mirror.internal.test.": {"mirror.internal.test. 60 IN A 10.0.0.7"},
	"cdn.test.":             {"cdn.test. 30 IN CNAME a.edge.test.", "a.edge.test. 20 IN CNAME b.edge.test.", "b.edge.test. 60 IN A 93.184.216.40", "junk.test. 60 IN A 93.184.216.99"},
	"partial.test.":         {"partial.test. 60 IN CNAME target.test."},
	"target.test.":          {"target.test. 60 IN A 93.184.216.41"},
	"loop.test.":            {"loop.test. 60 IN CNAME loop.test."},
	"big.test.":             {"big.test. 60 IN A 93.184.216.50"},
	"slow.test.":            {"slow.test. 60 IN A 93.184.216.51"},
}

func newUpstream(t testing.TB) *fakeUpstream {
	t.Helper()
	u := &fakeUpstream{asked: make(map[string]int)}
	var (
		pc  net.PacketConn
		ln  net.Listener
		err error
	)
	for range 20 {
		pc, err = net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		ln, err = net.Listen("tcp", pc.LocalAddr().String())
		if err == nil {
			break
		}
		pc.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	u.addr = pc.LocalAddr().String()
	udp := &dns.Server{PacketConn: pc, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, m *dns.Msg) { u.serve(w, m, "udp") })}
	tcp := &dns.Server{Listener: ln, Handler: dns.HandlerFunc(func(w dns.ResponseWriter, m *dns.Msg) { u.serve(w, m, "tcp") })}
	var wg sync.WaitGroup
	for _, s := range []*dns.Server{udp, tcp} {
		started := make(chan struct{})
		s.NotifyStartedFunc = func() { close(started) }
		wg.Go(func() { s.ActivateAndServe() })
		<-started
	}
	t.Cleanup(func() {
		udp.Shutdown()
		tcp.Shutdown()
		wg.Wait()
	})
	return u
}

func (u *fakeUpstream) serve(w dns.ResponseWriter, req *dns.Msg, transport string) {
	q := req.Question[0]
	name := strings.ToLower(q.Name)
	u.mu.Lock()
	u.asked[strings.TrimSuffix(name, ".")+" "+dns.TypeToString[q.Qtype]+" "+transport]++
	u.mu.Unlock()
	resp := new(dns.Msg)
	resp.SetReply(req)
	resp.RecursionAvailable = true
	switch name {
	case "big.test.":
		if transport == "udp" {
			resp.Truncated = true
			w.WriteMsg(resp)
			return
		}
	case "slow.test.":
		time.Sleep(1500 * time.Millisecond)
	case "spoof.test.":
		resp.Question[0].Name = "other.test."
		resp.Answer = append(resp.Answer, mustRR("other.test. 60 IN A 93.184.216.52"))
		w.WriteMsg(resp)
		return
	}
	rrs, ok := upstreamRecords[name]
	if !ok {
		resp.Rcode = dns.RcodeNameError
		resp.Ns = append(resp.Ns, mustRR("test. 3600 IN SOA ns.test. admin.test. 1 3600 600 86400 30"))
		w.WriteMsg(resp)
		return
	}
	for _, s := range rrs {
		rr := mustRR(s)
		if rr.Header().Rrtype == q.Qtype || rr.Header().Rrtype == dns.TypeCNAME {
			resp.Answer = append(resp.Answer, rr)
		}
	}
	w.WriteMsg(resp)
}

// count returns the queries the upstream got whose key starts with prefix
// ("pypi.test A", "big.test A tcp").
func (u *fakeUpstream) count(prefix string) int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for k, v := range u.asked {
		if k == prefix || strings.HasPrefix(k, prefix+" ") {
			n += v
		}
	}
	return n
}

// total returns every query the upstream got.
func (u *fakeUpstream) total() int {
	u.mu.Lock()
	defer u.mu.Unlock()
	n := 0
	for _, v := range u.asked {
		n += v
	}
	return n
}

// names returns the names the upstream was asked about.
func (u *fakeUpstream) names() []string {
	u.mu.Lock()
	defer u.mu.Unlock()
	var out []string
	for k := range u.asked {
		out = append(out, strings.Fields(k)[0])
	}
	return out
}

func mustRR(s string) dns.RR {
	rr, err := dns.NewRR(s)
	if err != nil {
		panic(err)
	}
	return rr
}
