package fusion

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// gather returns the values of the registry's series of name, keyed by
// their label values joined with ","; a histogram gives its sample count.
func gather(t *testing.T, reg *prometheus.Registry, name string) map[string]float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]float64{}
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			key := ""
			for i, l := range m.GetLabel() {
				if i > 0 {
					key += ","
				}
				key += l.GetValue()
			}
			switch {
			case m.Counter != nil:
				out[key] = m.GetCounter().GetValue()
			case m.Gauge != nil:
				out[key] = m.GetGauge().GetValue()
			case m.Histogram != nil:
				out[key] = float64(m.GetHistogram().GetSampleCount())
			}
		}
	}
	return out
}

func TestMetrics(t *testing.T) {
	s := newTestServer(t, Config{})
	s.cfg.PoolSize = 2
	s.cfg.CapacityWait = 10 * time.Second
	f := newFakes(t)
	// The platform is full for the first 100 ms: the call waits for room.
	until := time.Now().Add(100 * time.Millisecond)
	s.newSandbox = func(ctx context.Context, key poolKey) (*dsec.Sandbox, error) {
		if time.Now().Before(until) {
			return nil, &dsec.Error{Kind: dsec.ErrResourceExhausted, Message: "full", RetryAfter: 100 * time.Millisecond}
		}
		return f.create(ctx, key)
	}
	s.deleteSandbox = func(context.Context, *dsec.Sandbox) error { return nil }
	reg := prometheus.NewRegistry()
	reg.MustRegister(s.Collector())

	// A hostile client's language names do not make series.
	for _, lang := range []string{"cobol", "../../etc", "x\x00y"} {
		s.RunCode(t.Context(), &RunCodeRequest{Language: lang, Code: "1", RunTimeout: 1, CompileTimeout: 1})
	}
	// The client reaches no platform: the call fails writing its files,
	// after it waited for room and took its sandbox.
	resp := s.RunCode(t.Context(), &RunCodeRequest{Language: "bash", Code: "true", RunTimeout: 1, CompileTimeout: 1})
	if resp.Status != StatusSandboxError {
		t.Fatalf("bash call = %s %q, want SandboxError", resp.Status, resp.Message)
	}
	calls := gather(t, reg, "dsec_sandboxfusion_calls_total")
	if len(calls) != 2 || calls["other,SandboxError"] != 3 || calls["bash,SandboxError"] != 1 {
		t.Errorf("dsec_sandboxfusion_calls_total = %v, want other,SandboxError 3 and bash,SandboxError 1", calls)
	}
	if w := gather(t, reg, "dsec_sandboxfusion_queue_wait_seconds"); len(w) != 1 || w["bash"] != 1 {
		t.Errorf("dsec_sandboxfusion_queue_wait_seconds counts = %v, want bash 1 (the unknown languages never queued)", w)
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == "dsec_sandboxfusion_queue_wait_seconds" {
			if sum := mf.GetMetric()[0].GetHistogram().GetSampleSum(); sum < 0.1 {
				t.Errorf("queue wait of a call that waited 100 ms for room = %gs", sum)
			}
		}
	}
	waitFor(t, "a full pool", func() bool {
		return gather(t, reg, "dsec_sandboxfusion_pool_ready")[DefaultBashImage+",1024"] == 2
	})
	if size := gather(t, reg, "dsec_sandboxfusion_pool_size"); size[DefaultBashImage+",1024"] != 2 {
		t.Errorf("dsec_sandboxfusion_pool_size = %v, want %s,1024 2", size, DefaultBashImage)
	}
	if n := gather(t, reg, "dsec_sandboxfusion_calls_in_flight")[""]; n != 0 {
		t.Errorf("dsec_sandboxfusion_calls_in_flight = %g after every call ended, want 0", n)
	}
}
