// Package metrics defines dsec's Prometheus metrics and serves them. One
// Metrics is shared by the pieces of a process; each piece records what it
// sees (the apiserver errors by kind, the edge sandboxes and latencies).
package metrics

import (
	"net"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// Metrics holds the instruments.
type Metrics struct {
	Registry *prometheus.Registry
	// CreateSeconds is the time from a create request to a running sandbox.
	CreateSeconds *prometheus.HistogramVec
	// ExecStartSeconds is the time to start a command; ExecSeconds the
	// time from a start to the end of the command's stream.
	ExecStartSeconds *prometheus.HistogramVec
	ExecSeconds      *prometheus.HistogramVec
	// PauseSeconds is the time to pause a sandbox (stop it and push its
	// memory out); ResumeSeconds the time to make a paused one run again,
	// asked for or before a request that needs it running.
	PauseSeconds  *prometheus.HistogramVec
	ResumeSeconds *prometheus.HistogramVec
	// Errors counts API errors by kind and procedure.
	Errors *prometheus.CounterVec
}

var latencyBuckets = []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300}

// New returns the instruments registered in a new registry, with the Go
// runtime and process collectors.
func New() *Metrics {
	m := &Metrics{
		Registry: prometheus.NewRegistry(),
		CreateSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_create_duration_seconds", Help: "Time from a create request to a running sandbox.", Buckets: latencyBuckets,
		}, []string{"backend"}),
		ExecStartSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_exec_start_duration_seconds", Help: "Time to start a command in a sandbox.", Buckets: latencyBuckets,
		}, []string{"backend"}),
		ExecSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_exec_duration_seconds", Help: "Time from starting a command to the end of its exec stream.", Buckets: latencyBuckets,
		}, []string{"backend"}),
		PauseSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_pause_duration_seconds", Help: "Time to pause a sandbox: stop its processes and push its memory out of RAM.", Buckets: latencyBuckets,
		}, []string{"backend"}),
		ResumeSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "dsec_resume_duration_seconds", Help: "Time to resume a paused sandbox (asked for, or before a request that needs it running).", Buckets: latencyBuckets,
		}, []string{"backend"}),
		Errors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "dsec_api_errors_total", Help: "API errors by kind and procedure.",
		}, []string{"kind", "procedure"}),
	}
	m.Registry.MustRegister(m.CreateSeconds, m.ExecStartSeconds, m.ExecSeconds, m.PauseSeconds, m.ResumeSeconds, m.Errors,
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Handler serves the registry. Callers from loopback need no key; others
// are passed to authorized, which decides.
func (m *Metrics) Handler(authorized func(*http.Request) bool) http.Handler {
	h := promhttp.HandlerFor(m.Registry, promhttp.HandlerOpts{})
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if !FromLoopback(r) && (authorized == nil || !authorized(r)) {
			http.Error(w, "dsec: /metrics needs an API key from outside this machine", http.StatusUnauthorized)
			return
		}
		h.ServeHTTP(w, r)
	})
}

// FromLoopback reports whether a request came from this machine.
func FromLoopback(r *http.Request) bool {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
