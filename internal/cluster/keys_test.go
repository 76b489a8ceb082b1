package cluster

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var secretRE = regexp.MustCompile(`^dsk_[a-z2-7]{40}$`)

func createKey(t *testing.T, s *Store, spec KeySpec) (string, Key) {
	t.Helper()
	secret, k, err := s.CreateKey(testCtx(t), spec)
	if err != nil {
		t.Fatalf("CreateKey(%+v) = %v", spec, err)
	}
	return secret, k
}

func TestCreateKeyAuthenticate(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now

	secret, k := createKey(t, s, KeySpec{Name: "ci runner"})
	if !secretRE.MatchString(secret) {
		t.Errorf("CreateKey secret = %q, want dsk_ and 40 lowercase base32 characters", secret)
	}
	want := Key{ID: secret[4:12], Name: "ci runner", Project: DefaultProject, CreatedAt: created}
	if diff := cmp.Diff(want, k); diff != "" {
		t.Errorf("CreateKey key mismatch (-want +got):\n%s", diff)
	}
	got, err := s.Authenticate(ctx, secret)
	if err != nil || !cmp.Equal(got, want) {
		t.Errorf("Authenticate(secret) = %+v, %v, want %+v", got, err, want)
	}

	// Only the hash is stored, and nothing else holds the secret.
	resp, err := shared.Client().Get(ctx, s.prefix, clientv3.WithPrefix())
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(secret))
	var sawHash bool
	for _, kv := range resp.Kvs {
		if strings.Contains(string(kv.Value), secret[4:]) {
			t.Errorf("etcd value at %s holds the secret: %s", kv.Key, kv.Value)
		}
		sawHash = sawHash || strings.Contains(string(kv.Value), hex.EncodeToString(sum[:]))
	}
	if !sawHash {
		t.Errorf("no stored value holds the secret's SHA-256")
	}

	admin, ak := createKey(t, s, KeySpec{Name: "ops", Project: "team-a", Admin: true})
	if got, err := s.Authenticate(ctx, admin); err != nil || !got.Admin || got.Project != "team-a" || got.ID != ak.ID {
		t.Errorf("Authenticate(admin secret) = %+v, %v, want admin key %s of team-a", got, err, ak.ID)
	}
	if secret == admin {
		t.Errorf("two keys have the same secret")
	}
}

func TestAuthenticateRejects(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	secret, _ := createKey(t, s, KeySpec{})
	tests := []struct{ name, secret string }{
		{"empty", ""},
		{"prefix only", "dsk_"},
		{"no prefix", secret[4:]},
		{"other prefix", "dsx_" + secret[4:]},
		{"uppercase", "dsk_" + strings.ToUpper(secret[4:])},
		{"short", secret[:len(secret)-1]},
		{"long", secret + "a"},
		{"bad character", secret[:len(secret)-1] + "1"},
		{"with newline", secret + "\n"},
		{"unknown", "dsk_" + strings.Repeat("a", 40)},
		{"known ID, other secret", secret[:12] + strings.Repeat("b", 32)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			k, err := s.Authenticate(ctx, tt.secret)
			if !errdefs.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "dsec key create") {
				t.Errorf("Authenticate(%q) = %+v, %v, want Unauthenticated saying how to get a key", tt.secret, k, err)
			}
		})
	}
}

// TestAuthenticateCache checks how long a key deleted behind a Store's
// back (through another apiserver) keeps working: RevocationWindow
// without a watch; with one, only as long as the watch has not confirmed
// it saw the delete.
func TestAuthenticateCache(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{KeyCacheTTL: 30 * time.Second})
	clock := &fakeClock{t: created}
	s.now = clock.now
	secret, k := createKey(t, s, KeySpec{})
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate = %v", err)
	}
	// Delete the key behind the Store's back, as another apiserver would.
	if _, err := shared.Client().Delete(ctx, s.apiKeyKey(k.ID)); err != nil {
		t.Fatal(err)
	}
	clock.advance(RevocationWindow - time.Millisecond)
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Errorf("Authenticate within RevocationWindow = %v, want the cached key", err)
	}
	clock.advance(2 * time.Millisecond)
	if _, err := s.Authenticate(ctx, secret); !errdefs.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Authenticate after RevocationWindow = %v, want Unauthenticated", err)
	}

	// Confirmed by a watch, an entry lives for the TTL...
	secret, k = createKey(t, s, KeySpec{})
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate = %v", err)
	}
	for range 29 {
		clock.advance(time.Second)
		s.fresh.confirm(clock.now())
	}
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Errorf("Authenticate confirmed for 29s = %v, want the cached key", err)
	}
	clock.advance(2 * time.Second)
	s.fresh.confirm(clock.now())
	if _, err := shared.Client().Delete(ctx, s.apiKeyKey(k.ID)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Authenticate(ctx, secret); !errdefs.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Authenticate after the cache TTL = %v, want Unauthenticated", err)
	}

	// Deleting through this Store takes effect at once.
	secret, k = createKey(t, s, KeySpec{})
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate = %v", err)
	}
	if err := s.DeleteKey(ctx, k.ID); err != nil {
		t.Fatalf("DeleteKey = %v", err)
	}
	if _, err := s.Authenticate(ctx, secret); !errdefs.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Authenticate after DeleteKey = %v, want Unauthenticated", err)
	}
}

func TestAuthenticateConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	secret, k := createKey(t, s, KeySpec{})
	var wg sync.WaitGroup
	errs := make(chan error, 64)
	for range 64 {
		wg.Go(func() {
			got, err := s.Authenticate(ctx, secret)
			if err == nil && got.ID != k.ID {
				err = errdefs.Newf(errdefs.ErrInternal, "got key %s, want %s", got.ID, k.ID)
			}
			errs <- err
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		if err != nil {
			t.Errorf("concurrent Authenticate = %v", err)
		}
	}
	// A caller whose context is done stops waiting.
	canceled, cancel := context.WithCancel(ctx)
	cancel()
	s.keys.forget(k.ID)
	if _, err := s.Authenticate(canceled, secret); err == nil {
		t.Errorf("Authenticate(canceled ctx, uncached key) = nil error, want the context's")
	}
}

func TestListDeleteKeys(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now
	_, a := createKey(t, s, KeySpec{Name: "a"})
	_, b := createKey(t, s, KeySpec{Name: "b", Admin: true})
	want := []Key{a, b}
	if b.ID < a.ID {
		want = []Key{b, a}
	}
	got, err := s.ListKeys(ctx)
	if diff := cmp.Diff(want, got); err != nil || diff != "" {
		t.Errorf("ListKeys() = %v, mismatch (-want +got):\n%s", err, diff)
	}
	if err := s.DeleteKey(ctx, a.ID); err != nil {
		t.Fatalf("DeleteKey(%s) = %v", a.ID, err)
	}
	if got, err := s.ListKeys(ctx); err != nil || !cmp.Equal(got, []Key{b}) {
		t.Errorf("ListKeys() after DeleteKey = %v, %v, want [%v]", got, err, b)
	}
	if err := s.DeleteKey(ctx, a.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("DeleteKey(deleted) = %v, want NotFound", err)
	}
	if err := s.DeleteKey(ctx, "../x"); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("DeleteKey(../x) = %v, want InvalidArgument", err)
	}
}

func TestCreateKeyInvalid(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	for _, spec := range []KeySpec{
		{Project: "Team"},
		{Project: "a/b"},
		{Project: strings.Repeat("p", 64)},
		{Project: "team\n"},
		{Project: " team"},
		{Project: "-team"},
		{Project: "dsec-sandboxfusion"}, // reserved: the SandboxFusion pool's
		{Project: "dsec-sandboxfusion", Admin: true},
		{Project: "dsec-other"},
		{Name: "tab\there"},
		{Name: strings.Repeat("n", 129)},
	} {
		if _, _, err := s.CreateKey(testCtx(t), spec); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CreateKey(%+v) = %v, want InvalidArgument", spec, err)
		}
	}
}

func TestEnsureAdminKey(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	dir := filepath.Join(t.TempDir(), "state")
	path := filepath.Join(dir, "admin.key")

	secret, err := s.EnsureAdminKey(ctx, path)
	if err != nil {
		t.Fatalf("EnsureAdminKey(%s) = %v", path, err)
	}
	if !secretRE.MatchString(secret) {
		t.Errorf("EnsureAdminKey secret = %q, want a dsk_ key", secret)
	}
	b, err := os.ReadFile(path)
	if err != nil || string(b) != secret+"\n" {
		t.Errorf("admin key file = %q, %v, want %q", b, err, secret+"\n")
	}
	for p, want := range map[string]os.FileMode{path: 0o600, dir: 0o700} {
		if fi, err := os.Stat(p); err != nil || fi.Mode().Perm() != want {
			t.Errorf("stat %s = %v, %v, want mode %v", p, fi.Mode().Perm(), err, want)
		}
	}
	if k, err := s.Authenticate(ctx, secret); err != nil || !k.Admin || k.Name != AdminKeyName {
		t.Errorf("Authenticate(admin key) = %+v, %v, want an admin key", k, err)
	}

	again, err := s.EnsureAdminKey(ctx, path)
	if err != nil || again != secret {
		t.Errorf("EnsureAdminKey again = %q, %v, want %q", again, err, secret)
	}
	if keys, err := s.ListKeys(ctx); err != nil || len(keys) != 1 {
		t.Errorf("ListKeys() after EnsureAdminKey twice = %v, %v, want one key", keys, err)
	}

	// The etcd data is lost; the file brings the key back.
	if _, err := shared.Client().Delete(ctx, s.prefix, clientv3.WithPrefix()); err != nil {
		t.Fatal(err)
	}
	s.keys.forget(secret[4:12])
	if _, err := s.EnsureAdminKey(ctx, path); err != nil {
		t.Fatalf("EnsureAdminKey after data loss = %v", err)
	}
	if k, err := s.Authenticate(ctx, secret); err != nil || !k.Admin {
		t.Errorf("Authenticate(admin key) after data loss = %+v, %v, want an admin key", k, err)
	}

	// A file readable by others is restricted.
	if err := os.Chmod(path, 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := s.EnsureAdminKey(ctx, path); err != nil {
		t.Fatal(err)
	}
	if fi, err := os.Stat(path); err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("mode of %s after EnsureAdminKey = %v, %v, want 0600", path, fi.Mode().Perm(), err)
	}
}

func TestEnsureAdminKeyPromotes(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	secret, k := createKey(t, s, KeySpec{Name: "plain"})
	path := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(path, []byte(secret), 0o600); err != nil {
		t.Fatal(err)
	}
	if got, err := s.EnsureAdminKey(ctx, path); err != nil || got != secret {
		t.Fatalf("EnsureAdminKey = %q, %v, want %q", got, err, secret)
	}
	if got, err := s.Authenticate(ctx, secret); err != nil || !got.Admin || got.ID != k.ID {
		t.Errorf("Authenticate = %+v, %v, want key %s promoted to admin", got, err, k.ID)
	}
}

func TestEnsureAdminKeyMalformedFile(t *testing.T) {
	t.Parallel()
	s := newTestStore(t, StoreConfig{})
	path := filepath.Join(t.TempDir(), "admin.key")
	if err := os.WriteFile(path, []byte("not a key\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	_, err := s.EnsureAdminKey(testCtx(t), path)
	if !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), path) {
		t.Errorf("EnsureAdminKey(malformed file) = %v, want FailedPrecondition naming %s", err, path)
	}
}

func TestEnsureAdminKeyConcurrent(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	path := filepath.Join(t.TempDir(), "admin.key")
	secrets := make([]string, 4)
	var wg sync.WaitGroup
	for i := range secrets {
		wg.Go(func() {
			var err error
			if secrets[i], err = s.EnsureAdminKey(ctx, path); err != nil {
				t.Errorf("EnsureAdminKey = %v", err)
			}
		})
	}
	wg.Wait()
	for _, sec := range secrets[1:] {
		if sec != secrets[0] {
			t.Errorf("concurrent EnsureAdminKey returned %q and %q, want one secret", secrets[0], sec)
		}
	}
	if keys, err := s.ListKeys(ctx); err != nil || len(keys) != 1 {
		t.Errorf("ListKeys() = %v, %v, want only the admin key", keys, err)
	}
	if m, _ := filepath.Glob(filepath.Join(filepath.Dir(path), ".admin.key.tmp*")); len(m) != 0 {
		t.Errorf("temporary files left: %v", m)
	}
}
