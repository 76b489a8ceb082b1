package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/miekg/dns"

	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// netFakes are the hosts issue 14's checks run against, on the host's own
// address (the egress proxy dials from the host's network namespace; a
// loopback address would be the sandbox's own loopback; the node's
// addresses are out of a sandbox's reach unless the operator's network
// config names them, as it does here, pointing the catalogue's names at
// the fakes): a PEP 503 "pypi" index over HTTP serving a real wheel, an
// HTTPS "npm" with a test CA, a TCP echo, and a DNS server that answers
// every name with a marker address no policy allows.
type netFakes struct {
	pypi           *fakeIndex
	pypiHost       string
	pypiPort       int
	npmHost        string
	npmPort        int
	echoHost       string
	echoPort       int
	dnsHost        string
	dnsHits        chan string
	pypiOtherPort  int // a listener on the pypi host's address, another port
	configPath     string
	wheelName      string
	wheelValue     string
	npmRequests    func() int
	echoReached    chan struct{}
	otherPortReach chan struct{}
}

// dnsMarker is what the fake DNS server answers: a sandbox that sees it
// reached a resolver of its own.
const dnsMarker = "192.0.2.99"

func startNetFakes(t *testing.T) *netFakes {
	t.Helper()
	addrs := nodeAddrs(t)
	if len(addrs) == 0 {
		t.Fatal("this host has no IPv4 address but loopback: the fake hosts need one the sandboxes do not share")
	}
	host := addrs[0]
	f := &netFakes{pypiHost: host, npmHost: host, echoHost: host, dnsHost: host,
		wheelName: "dsecprobe", wheelValue: "from the fake index", dnsHits: make(chan string, 64),
		echoReached: make(chan struct{}, 64), otherPortReach: make(chan struct{}, 64)}
	file, data := wheel(t, f.wheelName, "1.0", f.wheelValue)
	f.pypi = startFakeIndex(t, f.pypiHost+":0", f.wheelName, file, data)
	_, port, _ := net.SplitHostPort(f.pypi.Addr)
	f.pypiPort, _ = strconv.Atoi(port)

	var npmHits int
	npm := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		npmHits++
		fmt.Fprintln(w, `{"name":"left-pad"}`)
	}))
	ln, err := net.Listen("tcp", f.npmHost+":0")
	if err != nil {
		t.Fatal(err)
	}
	npm.Listener = ln
	npm.StartTLS()
	t.Cleanup(npm.Close)
	f.npmPort = ln.Addr().(*net.TCPAddr).Port
	f.npmRequests = func() int { return npmHits }

	echo := func(addr string, reached chan struct{}) int {
		ln, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { ln.Close() })
		go func() {
			for {
				c, err := ln.Accept()
				if err != nil {
					return
				}
				select {
				case reached <- struct{}{}:
				default:
				}
				go func() {
					defer c.Close()
					buf := make([]byte, 512)
					n, _ := c.Read(buf)
					c.Write(buf[:n])
				}()
			}
		}()
		return ln.Addr().(*net.TCPAddr).Port
	}
	f.echoPort = echo(f.echoHost+":0", f.echoReached)
	f.pypiOtherPort = echo(f.pypiHost+":0", f.otherPortReach)

	mux := dns.NewServeMux()
	mux.HandleFunc(".", func(w dns.ResponseWriter, q *dns.Msg) {
		select {
		case f.dnsHits <- q.Question[0].Name:
		default:
		}
		m := new(dns.Msg)
		m.SetReply(q)
		if q.Question[0].Qtype == dns.TypeA {
			rr, _ := dns.NewRR(q.Question[0].Name + " 60 IN A " + dnsMarker)
			m.Answer = append(m.Answer, rr)
		}
		w.WriteMsg(m)
	})
	pc, err := net.ListenPacket("udp", f.dnsHost+":53")
	if err != nil {
		t.Fatal(err)
	}
	srv := &dns.Server{PacketConn: pc, Handler: mux}
	go srv.ActivateAndServe()
	t.Cleanup(func() { srv.Shutdown() })

	// The operator's config: pypi and npm point at the fakes ([hosts]
	// makes the names internal, so they may resolve to loopback), and the
	// node resolver asks the fake DNS server for every other name.
	f.configPath = filepath.Join(t.TempDir(), "network.toml")
	config := fmt.Sprintf(`version = 1

[services.pypi]
domains = ["pypi.org", "files.pythonhosted.org"]
ports   = [%d]

[services.npm]
domains = ["registry.npmjs.org"]
ports   = [%d]

[resolver]
upstreams = ["%s:53"]

[hosts]
"pypi.org" = ["%s"]
"files.pythonhosted.org" = ["%s"]
"registry.npmjs.org" = ["%s"]
`, f.pypiPort, f.npmPort, f.dnsHost, f.pypiHost, f.pypiHost, f.npmHost)
	if err := os.WriteFile(f.configPath, []byte(config), 0o644); err != nil {
		t.Fatal(err)
	}
	return f
}

// TestNetworkPip is issue 14's acceptance: DSec's listing with
// network_rules={"pypi": True, "npm": False}, verbatim through the Python
// SDK, pip downloads and installs a real wheel from the fake index; npm's
// name is NXDOMAIN and its address refused fast; the TCP echo is
// unreachable; and every bypass attempt from inside fails, under that
// allow list and again under open (changed while the sandbox runs).
func TestNetworkPip(t *testing.T) {
	python := requirePython(t)
	f := startNetFakes(t)
	p := newPlatform(t, func(p *platform) { p.Extra = append(p.Extra, "--network-config", f.configPath) })
	p.Busybox(t)
	start := time.Now()
	pythonImage(t, p, "test/pip") // Debian's python3-pip, shared with other tests
	t.Logf("the pip image ready in %.0fs", time.Since(start).Seconds())

	// DSec's listing, with pip in the sandbox as an agent would run it.
	index := fmt.Sprintf("http://pypi.org:%d/simple/", f.pypiPort)
	script := fmt.Sprintf(`
import asyncio, json
from libdsec import DSecClient, DSecContainerRunArgs

async def main():
    client = DSecClient(); await client.open()
    args = DSecContainerRunArgs(container_image="test/pip", memory_limit_mb=1024, cpu_cores_limit=1,
                                ttl_running_stop=600, network_rules={"pypi": True, "npm": False}, init_user="root")
    sandbox = await client.run_container(args, timeout=120)
    result = await sandbox.run_shell(
        "pip download --disable-pip-version-check --no-cache-dir --index-url %[1]s --trusted-host pypi.org -d /tmp/dl %[2]s && "
        "pip install --disable-pip-version-check --no-cache-dir --break-system-packages --index-url %[1]s --trusted-host pypi.org %[2]s && "
        "cd / && python3 -c 'import %[2]s; print(%[2]s.VALUE)'")
    print(json.dumps({"id": sandbox.id, "stdout": result.stdout, "stderr": result.stderr, "exit": result.exit_code}))
    await client.close()

asyncio.run(main())
`, index, f.wheelName)
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, python, "-c", script)
	cmd.Dir = filepath.Join(testenv.ModuleRoot(), "sdk", "python")
	cmd.Env = pythonEnv(t, p)
	out, err := cmd.Output()
	if err != nil {
		var stderr []byte
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = ee.Stderr
		}
		t.Fatalf("the listing: %v\n%s%s", err, out, stderr)
	}
	var listing struct {
		ID, Stdout, Stderr string
		Exit               int
	}
	if err := json.Unmarshal(out, &listing); err != nil {
		t.Fatalf("the listing printed %q: %v", out, err)
	}
	if listing.Exit != 0 || !strings.HasSuffix(listing.Stdout, f.wheelValue+"\n") {
		log, _, _ := p.CLI(t, "", "net", "log", listing.ID)
		show, _, _ := p.CLI(t, "", "net", "show", listing.ID)
		t.Fatalf("pip in the sandbox: exit %d\n%s\n%s\ndsec net show:\n%s\ndsec net log:\n%s", listing.Exit, listing.Stdout, listing.Stderr, show, log)
	}
	if host := <-f.pypi.Hosts; host != fmt.Sprintf("pypi.org:%d", f.pypiPort) {
		t.Errorf("the index saw Host %q", host)
	}

	c := p.Client(t, p.AdminKey(t))
	sb := c.Sandbox(listing.ID)
	t.Cleanup(func() { sb.Delete(context.WithoutCancel(ctx)) })
	other, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Network: dsec.NetworkFlag("open")})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Delete(context.WithoutCancel(ctx)) })
	if _, err := other.ExecDetached(ctx, dsec.ExecRequest{Argv: []string{"sh", "-c", "while true; do nc -l -p 9000 -e echo reached; done"}}); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*dsec.Sandbox{sb, other} {
		if st, err := s.Stats(ctx); err != nil || !st.Networked {
			t.Errorf("Stats of %s = %+v, %v; want networked", s.ID, st, err)
		}
	}
	otherInfo, err := other.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	info, err := sb.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	probe, err := os.ReadFile(filepath.Join(testenv.ModuleRoot(), "e2e", "testdata", "netprobe.py"))
	if err != nil {
		t.Fatal(err)
	}
	if err := sb.WriteFile(ctx, "/tmp/netprobe.py", probe); err != nil {
		t.Fatal(err)
	}
	_, apiPort, _ := net.SplitHostPort(p.Addr)
	targets := map[string]any{
		"pypi_host": f.pypiHost, "pypi_port": f.pypiPort, "npm_host": f.npmHost, "npm_port": f.npmPort,
		"echo_host": f.echoHost, "echo_port": f.pypiOtherPort, "dns_host": f.dnsHost,
		"api_port": mustAtoi(t, apiPort), "node_addrs": nodeAddrs(t), "other_sandbox": otherInfo.Address,
		"router": info.Gateway,
	}
	arg, _ := json.Marshal(targets)

	for _, mode := range []struct{ name, policy string }{
		{"allow list", "allow=pypi,deny=npm"},
		{"open", "open,allow=pypi"},
	} {
		t.Run(mode.name, func(t *testing.T) {
			if _, err := sb.UpdateNetwork(ctx, dsec.NetworkFlag(mode.policy), false); err != nil {
				t.Fatal(err)
			}
			r, err := sb.Exec(ctx, []string{"python3", "/tmp/netprobe.py", string(arg)}, dsec.WithTimeout(2*time.Minute))
			if err != nil {
				t.Fatal(err)
			}
			if r.Code() != 0 {
				t.Fatalf("netprobe: exit %d\n%s\n%s", r.Code(), r.Stdout, r.Stderr)
			}
			var res map[string]struct {
				OK     bool
				Result any
				Error  string
				S      float64
			}
			if err := json.Unmarshal(r.Stdout, &res); err != nil {
				t.Fatalf("netprobe printed %q: %v", r.Stdout, err)
			}
			got := func(name string) (bool, any, string, float64) {
				t.Helper()
				v, ok := res[name]
				if !ok {
					t.Fatalf("netprobe has no %s: %s", name, r.Stdout)
				}
				return v.OK, v.Result, v.Error, v.S
			}
			must := func(name string, want bool, check func(any) bool) {
				t.Helper()
				ok, result, errText, s := got(name)
				if ok != want || ok && check != nil && !check(result) {
					t.Errorf("%s: ok=%v result=%v error=%q (%.2fs), want ok=%v", name, ok, result, errText, s, want)
				}
				if !want && s > 1.5 {
					t.Errorf("%s failed only after %.2fs: a refusal must be fast", name, s)
				}
			}
			must("pypi_name", true, func(v any) bool { return v == f.pypiHost })
			must("pypi_http", true, func(v any) bool { return strings.HasPrefix(v.(string), "HTTP/1.1 200") })
			// Under open the name of npm resolves (open allows names), but
			// its address is the operator's and no rule names it.
			must("npm_name", mode.name == "open", nil)
			must("npm_addr", false, nil)
			must("echo", false, nil)
			must("pypi_other_port", false, nil)
			must("pypi_addr_denied_host", false, nil)
			must("pypi_addr_denied_sni", false, nil)
			must("pypi_allowed_sni_other_addr", false, nil)
			must("own_resolver_allowed", true, func(v any) bool {
				m := v.(map[string]any)
				ips, _ := m["ips"].([]any)
				return len(ips) == 1 && ips[0] == f.pypiHost
			})
			if mode.name != "open" {
				must("own_resolver_denied", true, func(v any) bool { return v.(map[string]any)["rcode"] == float64(3) })
			}
			must("own_resolver_public", true, func(v any) bool {
				ips, _ := v.(map[string]any)["ips"].([]any)
				for _, ip := range ips {
					if ip == dnsMarker {
						return false // a public name may not resolve to a documentation address
					}
				}
				return true
			})
			must("ipv6", false, nil)
			must("ipv6_loopback_host", false, nil)
			must("host_api", false, nil)
			must("node_addrs", true, func(v any) bool {
				for _, open := range v.(map[string]any) {
					if len(open.([]any)) != 0 {
						return false
					}
				}
				return true
			})
			must("other_sandbox", false, nil)
			must("metadata", false, nil)
			must("scan_router", true, func(v any) bool { return len(v.([]any)) == 0 })
			must("icmp_router", false, nil)
			must("icmp_echo_host", false, nil)
			must("packet_socket", false, nil)
		})
	}
	select {
	case <-f.echoReached:
		t.Errorf("the TCP echo was reached from the sandbox")
	case <-f.otherPortReach:
		t.Errorf("another port of the pypi host was reached from the sandbox")
	default:
	}
	if n := f.npmRequests(); n != 0 {
		t.Errorf("the npm server got %d requests", n)
	}
	for {
		select {
		case name := <-f.dnsHits:
			if !strings.HasPrefix(name, "leak.example.com") {
				t.Errorf("the fake DNS server was asked %q: only the node resolver's forwarding of an allowed name may reach it", name)
			}
			continue
		default:
		}
		break
	}
	// The denials are there for the user to see.
	stdout, stderr, code := p.CLI(t, "", "net", "log", listing.ID)
	if code != 0 || !strings.Contains(stdout, f.npmHost) {
		t.Errorf("dsec net log: exit %d, %q %q; want the npm address's denial", code, stdout, stderr)
	}
}

func mustAtoi(t *testing.T, s string) int {
	t.Helper()
	n, err := strconv.Atoi(s)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// nodeAddrs are the host's own IPv4 addresses other than loopback.
func nodeAddrs(t *testing.T) []string {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for _, a := range addrs {
		if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && !ip.IP.IsLoopback() {
			out = append(out, ip.IP.String())
		}
	}
	return out
}
