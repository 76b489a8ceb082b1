package server

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/dsecproject/dsec/internal/apiserver"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// TestFusionKeys checks when the SandboxFusion listener needs a key:
// beyond loopback always, on loopback only with RequireKey; and that the
// key file is checked before anything starts.
func TestFusionKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	dir := t.TempDir()
	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	defer etcd.Close()
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	admin, err := store.EnsureAdminKey(ctx, filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	user, _, err := store.CreateKey(ctx, cluster.KeySpec{Name: "user"})
	if err != nil {
		t.Fatal(err)
	}
	var keys apiserver.ServiceKeys
	// One registry for every server in turn: each registers its metrics
	// and takes them out when it stops.
	reg := prometheus.NewRegistry()
	api := apiserver.New(apiserver.Config{Cluster: store, ServiceKeys: &keys, Logger: log})

	ping := func(t *testing.T, addr, key string) int {
		t.Helper()
		_, port, _ := net.SplitHostPort(addr)
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:"+port+"/v1/ping", nil)
		if key != "" {
			req.Header.Set("Authorization", "Bearer "+key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	for _, tt := range []struct {
		name       string
		fc         FusionConfig
		keyless    int
		user, bad  int
		adminKeyed int
	}{
		{"loopback", FusionConfig{Listen: "127.0.0.1:0"}, 200, 200, 401, 200},
		{"loopback, require key", FusionConfig{Listen: "127.0.0.1:0", RequireKey: true}, 401, 200, 401, 200},
		{"beyond loopback", FusionConfig{Listen: "0.0.0.0:0"}, 401, 200, 401, 200},
		{"beyond loopback, one key", FusionConfig{Listen: "0.0.0.0:0", KeyFile: writeKey(t, user)}, 401, 200, 401, 401},
	} {
		t.Run(strings.ReplaceAll(tt.name, " ", "_"), func(t *testing.T) {
			tt.fc.PoolSize = -1
			ln, err := listenFusion(&tt.fc, dir)
			if err != nil {
				t.Fatalf("listenFusion(%+v) = %v", tt.fc, err)
			}
			defer ln.Close()
			stop, err := startFusion(ctx, tt.fc, ln, "http://127.0.0.1:1", &keys, api, "test", reg, log)
			if err != nil {
				t.Fatal(err)
			}
			defer stop()
			if !hasMetric(t, reg, "dsec_sandboxfusion_calls_in_flight") {
				t.Errorf("the registry has no dsec_sandboxfusion_calls_in_flight while the SandboxFusion API runs")
			}
			addr := ln.Addr().String()
			for _, c := range []struct {
				what, key string
				want      int
			}{
				{"no key", "", tt.keyless},
				{"a user's key", user, tt.user},
				{"a wrong key", "dsk_" + strings.Repeat("a", 40), tt.bad},
				{"the admin key", admin, tt.adminKeyed},
			} {
				if got := ping(t, addr, c.key); got != c.want {
					t.Errorf("GET /v1/ping with %s = %d, want %d", c.what, got, c.want)
				}
			}
		})
	}

	for _, tt := range []struct {
		name string
		fc   FusionConfig
	}{
		{"missing key file", FusionConfig{Listen: "127.0.0.1:0", KeyFile: filepath.Join(dir, "none")}},
		{"empty key file", FusionConfig{Listen: "127.0.0.1:0", KeyFile: writeKey(t, "")}},
		{"admin key beyond loopback", FusionConfig{Listen: "0.0.0.0:0", KeyFile: writeKey(t, admin)}},
	} {
		ln, err := listenFusion(&tt.fc, dir)
		if ln != nil {
			ln.Close()
		}
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "--sandboxfusion-key-file") {
			t.Errorf("%s: listenFusion = %v, want InvalidArgument naming --sandboxfusion-key-file", tt.name, err)
		}
	}
	// The admin key may be the only key on loopback (no URLs leave the
	// machine).
	fc := FusionConfig{Listen: "127.0.0.1:0", KeyFile: writeKey(t, admin)}
	ln, err := listenFusion(&fc, dir)
	if err != nil {
		t.Errorf("listenFusion(admin key on loopback) = %v, want it to start", err)
	} else {
		ln.Close()
	}
}

func hasMetric(t *testing.T, reg *prometheus.Registry, name string) bool {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name {
			return true
		}
	}
	return false
}

func writeKey(t *testing.T, key string) string {
	t.Helper()
	f, err := os.CreateTemp(t.TempDir(), "key")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if _, err := f.WriteString(key + "\n"); err != nil {
		t.Fatal(err)
	}
	return f.Name()
}
