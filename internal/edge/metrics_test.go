package edge

import (
	"context"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsecproject/dsec/internal/sandbox"
)

// statsBackend is a backend that only reports stats; the collector calls
// nothing else.
type statsBackend struct{ sandbox.Backend }

func (statsBackend) Stats(context.Context, string) (sandbox.Stats, error) {
	return sandbox.Stats{CPUUsage: 2 * time.Second, MemoryBytes: 100 << 20}, nil
}

// scrape returns what /metrics shows of an edge holding two running
// sandboxes of project "alpha" and one exited one of "beta".
func scrape(t *testing.T, perSandbox bool) string {
	t.Helper()
	st, err := openStore(filepath.Join(t.TempDir(), "edge.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.close() })
	for _, r := range []*Record{
		{ID: "n-aaaaaaaaaaa1", Project: "alpha", Backend: "container", State: StateRunning, Resources: sandbox.Resources{CPUs: 1, MemoryBytes: 512 << 20}},
		{ID: "n-aaaaaaaaaaa2", Project: "alpha", Backend: "container", State: StateRunning, Resources: sandbox.Resources{CPUs: 2, MemoryBytes: 1 << 30}},
		{ID: "n-bbbbbbbbbbb1", Project: "beta", Backend: "container", State: StateExited},
	} {
		if err := st.insert(r); err != nil {
			t.Fatal(err)
		}
	}
	e := &Edge{store: st, cfg: Config{
		DefaultBackend: "container", MetricsPerSandbox: perSandbox,
		Backends: map[string]sandbox.Backend{"container": statsBackend{}},
	}}
	return gather(t, e)
}

// gather returns what /metrics shows of e, one series a line.
func gather(t *testing.T, e *Edge) string {
	t.Helper()
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(collector{e}); err != nil {
		t.Fatal(err)
	}
	var b strings.Builder
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("Gather = %v", err)
	}
	for _, mf := range mfs {
		for _, m := range mf.GetMetric() {
			b.WriteString(mf.GetName())
			for _, l := range m.GetLabel() {
				b.WriteString(" " + l.GetName() + "=" + l.GetValue())
			}
			v := m.GetGauge().GetValue() + m.GetCounter().GetValue()
			b.WriteString(" " + strconv.FormatFloat(v, 'f', -1, 64) + "\n")
		}
	}
	return b.String()
}

func TestMetricsAggregatesOnly(t *testing.T) {
	out := scrape(t, false)
	for _, id := range []string{"n-aaaaaaaaaaa1", "n-aaaaaaaaaaa2", "n-bbbbbbbbbbb1"} {
		if strings.Contains(out, id) {
			t.Errorf("/metrics without --metrics-per-sandbox names sandbox %s:\n%s", id, out)
		}
	}
	for _, want := range []string{
		"dsec_sandboxes backend=container project=alpha state=running 2\n",
		"dsec_sandboxes backend=container project=beta state=exited 1\n",
		"dsec_sandboxes_memory_limit_bytes backend=container project=alpha 1610612736\n",
		"dsec_sandboxes_cpus_limit backend=container project=alpha 3\n",
		"dsec_sandboxes_cpu_seconds backend=container project=alpha 4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
}

func TestMetricsPerSandbox(t *testing.T) {
	out := scrape(t, true)
	for _, want := range []string{
		"dsec_sandbox_memory_bytes project=alpha sandbox=n-aaaaaaaaaaa1",
		"dsec_sandbox_cpu_seconds_total project=alpha sandbox=n-aaaaaaaaaaa2",
		"dsec_sandboxes_memory_bytes backend=container project=alpha",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics with --metrics-per-sandbox lacks %q:\n%s", want, out)
		}
	}
}

// TestMetricsAdmission: /metrics shows what admission holds, so an operator
// sees it balance: exited sandboxes still hold, deleted ones do not.
func TestMetricsAdmission(t *testing.T) {
	n := newTestNode(t)
	e := n.open()
	defer e.Close()
	a, b := create(t, e, 64*testMiB), create(t, e, 128*testMiB)
	n.node.Exit(a.ID, "done")
	eventually(t, "exit recorded", func() bool { return state(e, a.ID) == StateExited })
	out := gather(t, e)
	for _, want := range []string{
		"dsec_node_memory_committed_bytes 201326592\n",
		"dsec_node_memory_capacity_bytes 1073741824\n",
		"dsec_node_disk_committed_bytes 67108864\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
	for _, id := range []string{a.ID, b.ID} {
		if err := e.Delete(context.Background(), admin, id); err != nil {
			t.Fatal(err)
		}
	}
	if out := gather(t, e); !strings.Contains(out, "dsec_node_memory_committed_bytes 0\n") || !strings.Contains(out, "dsec_node_disk_committed_bytes 0\n") {
		t.Errorf("/metrics after every sandbox was deleted:\n%s", out)
	}
}

// netStatsBackend also reports networks: the node's totals in one call, and
// each sandbox's counters.
type netStatsBackend struct{ statsBackend }

func (netStatsBackend) NetworkTotals(context.Context) (sandbox.NetworkTotals, error) {
	return sandbox.NetworkTotals{BytesOut: 1000, BytesIn: 2000, ConnsOut: 7, ConnsActive: 2, Denied: 3, DNSQueries: 11, DNSDenied: 4}, nil
}

func (netStatsBackend) SetNetwork(context.Context, string, []byte) (sandbox.NetworkInfo, error) {
	return sandbox.NetworkInfo{}, nil
}

func (netStatsBackend) Network(_ context.Context, id string) (sandbox.NetworkInfo, error) {
	return sandbox.NetworkInfo{BytesOut: 10, BytesIn: 20, ConnsOut: 1, Denied: 5, DNSQueries: 6, DNSDenied: 2}, nil
}

// scrapeNet returns what /metrics shows of an edge whose backend has
// networks, holding a running sandbox with a network and one without.
func scrapeNet(t *testing.T, perSandbox bool) string {
	t.Helper()
	st, err := openStore(filepath.Join(t.TempDir(), "edge.db"), 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.close() })
	for _, r := range []*Record{
		{ID: "n-nnnnnnnnnnn1", Project: "alpha", Backend: "container", State: StateRunning, Network: []byte(`{"mode":"open"}`)},
		{ID: "n-nnnnnnnnnnn2", Project: "alpha", Backend: "container", State: StateRunning},
	} {
		if err := st.insert(r); err != nil {
			t.Fatal(err)
		}
	}
	e := &Edge{store: st, cfg: Config{
		DefaultBackend: "container", MetricsPerSandbox: perSandbox,
		Backends: map[string]sandbox.Backend{"container": netStatsBackend{}},
	}}
	return gather(t, e)
}

// TestMetricsNetwork: /metrics has the node's network counters, from the
// backend's totals, and no sandbox's unless --metrics-per-sandbox, which
// adds series for the sandboxes with a network only.
func TestMetricsNetwork(t *testing.T) {
	out := scrapeNet(t, false)
	for _, want := range []string{
		"dsec_net_bytes_out_total backend=container 1000\n",
		"dsec_net_bytes_in_total backend=container 2000\n",
		"dsec_net_connections_total backend=container 7\n",
		"dsec_net_connections_active backend=container 2\n",
		"dsec_net_denied_total backend=container 3\n",
		"dsec_net_dns_queries_total backend=container 11\n",
		"dsec_net_dns_denied_total backend=container 4\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "n-nnnnnnnnnnn") || strings.Contains(out, "dsec_net_sandbox_") {
		t.Errorf("/metrics without --metrics-per-sandbox names sandboxes:\n%s", out)
	}

	out = scrapeNet(t, true)
	for _, want := range []string{
		"dsec_net_sandbox_bytes_out_total project=alpha sandbox=n-nnnnnnnnnnn1 10\n",
		"dsec_net_sandbox_bytes_in_total project=alpha sandbox=n-nnnnnnnnnnn1 20\n",
		"dsec_net_sandbox_denied_total project=alpha sandbox=n-nnnnnnnnnnn1 5\n",
		"dsec_net_sandbox_dns_denied_total project=alpha sandbox=n-nnnnnnnnnnn1 2\n",
		"dsec_net_bytes_out_total backend=container 1000\n",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("/metrics with --metrics-per-sandbox lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "dsec_net_sandbox_bytes_out_total project=alpha sandbox=n-nnnnnnnnnnn2") {
		t.Errorf("/metrics has network series of a sandbox without network:\n%s", out)
	}
}
