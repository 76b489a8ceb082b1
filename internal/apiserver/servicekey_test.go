package apiserver

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/project"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func TestServiceKeys(t *testing.T) {
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	dir := t.TempDir()
	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	admin, err := store.EnsureAdminKey(ctx, filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}
	var svc ServiceKeys
	if _, err := svc.New("x", project.Default); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("ServiceKeys.New(x, %q) = %v, want InvalidArgument (not a reserved project)", project.Default, err)
	}
	secret, err := svc.New("sandboxfusion", project.SandboxFusion)
	if err != nil {
		t.Fatal(err)
	}
	s := New(Config{Cluster: store, ServiceKeys: &svc, Logger: log})

	for _, tt := range []struct {
		name, secret, project string
	}{
		{"service key", secret, project.SandboxFusion},
		{"stored admin key", admin, project.Default},
	} {
		k, err := s.Authenticate(ctx, tt.secret)
		if err != nil || k.Project != tt.project {
			t.Errorf("Authenticate(%s) = %+v, %v; want project %s", tt.name, k, err, tt.project)
		}
	}
	for _, bad := range []string{"", secret + "x", secret[:len(secret)-1], "dsk_" + secret[4:len(secret)-1] + "a"} {
		if k, err := s.Authenticate(ctx, bad); !errdefs.Is(err, errdefs.ErrUnauthenticated) {
			t.Errorf("Authenticate(%q) = %+v, %v; want Unauthenticated", bad, k, err)
		}
	}
	// Nobody else's ServiceKeys know the secret.
	other := New(Config{Cluster: store, Logger: log})
	if _, err := other.Authenticate(ctx, secret); !errdefs.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Authenticate(service key) on a server without it = %v, want Unauthenticated", err)
	}

	// Through the API, the service key acts in its project and is no admin.
	srv := httptest.NewUnstartedServer(s.Handler())
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	defer srv.Close()
	c, err := dsec.New(dsec.Config{Addr: srv.URL, APIKey: secret})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	k, err := c.WhoAmI(ctx)
	if err != nil || k.Project != project.SandboxFusion || k.Admin {
		t.Errorf("WhoAmI(service key) = %+v, %v; want project %s, not admin", k, err, project.SandboxFusion)
	}
	ac, err := dsec.New(dsec.Config{Addr: srv.URL, APIKey: admin})
	if err != nil {
		t.Fatal(err)
	}
	defer ac.Close()
	if _, _, err := ac.CreateKey(ctx, dsec.KeyOptions{Project: project.SandboxFusion}); !errors.Is(err, dsec.ErrInvalidArgument) {
		t.Errorf("CreateKey(project %s) with the admin key = %v, want InvalidArgument", project.SandboxFusion, err)
	}
}
