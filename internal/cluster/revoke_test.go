package cluster

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// TestRevokeAcrossStores revokes a key through one Store (one apiserver)
// while another, with its CacheWatch running and the key cached, keeps
// authenticating it: the other must refuse it within RevocationWindow, and
// in between keep the key cached (no etcd read per call).
func TestRevokeAcrossStores(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a := newTestStore(t, StoreConfig{})
	b := NewStore(shared.Client(), StoreConfig{Logger: testLogger()})
	b.prefix = a.prefix
	w := b.WatchCaches()
	defer w.Close()
	secret, k := createKey(t, a, KeySpec{Name: "victim"})

	// Let the watch start and confirm, then cache the key in b.
	deadline := time.Now().Add(10 * time.Second)
	for b.fresh.confirmed.Load() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the watch confirmed nothing within 10s")
		}
		time.Sleep(10 * time.Millisecond)
	}
	if _, err := b.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate(b) = %v", err)
	}
	// Confirmed, the entry outlives RevocationWindow.
	time.Sleep(RevocationWindow + 200*time.Millisecond)
	if _, ok := b.keys.get(k.ID, b.now()); !ok {
		t.Errorf("key not cached %s after it was read, with the watch running", RevocationWindow+200*time.Millisecond)
	}

	revoked := time.Now()
	got, err := a.RevokeKey(ctx, k.ID)
	if err != nil || got.ID != k.ID || got.Name != "victim" {
		t.Fatalf("RevokeKey = %+v, %v, want key %s", got, err, k.ID)
	}
	for {
		_, err := b.Authenticate(ctx, secret)
		if errdefs.Is(err, errdefs.ErrUnauthenticated) {
			break
		}
		if err != nil {
			t.Fatalf("Authenticate(b) = %v", err)
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("a key revoked through another Store still works after %s", time.Since(revoked))
		}
		time.Sleep(5 * time.Millisecond)
	}
	t.Logf("refused %s after the revocation", time.Since(revoked).Round(time.Millisecond))
	if _, err := a.RevokeKey(ctx, k.ID); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("RevokeKey(revoked) = %v, want NotFound", err)
	}
}

// TestRevokeWithoutWatch: with no watch running, a revoked key still
// goes within RevocationWindow.
func TestRevokeWithoutWatch(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	a := newTestStore(t, StoreConfig{})
	b := NewStore(shared.Client(), StoreConfig{Logger: testLogger()})
	b.prefix = a.prefix
	secret, k := createKey(t, a, KeySpec{})
	if _, err := b.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate(b) = %v", err)
	}
	revoked := time.Now()
	if err := a.DeleteKey(ctx, k.ID); err != nil {
		t.Fatal(err)
	}
	for {
		_, err := b.Authenticate(ctx, secret)
		if errdefs.Is(err, errdefs.ErrUnauthenticated) {
			break
		}
		if time.Since(revoked) > time.Second {
			t.Fatalf("a revoked key still works after %s", time.Since(revoked))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func TestKeyExpiry(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	clock := &fakeClock{t: created}
	s.now = clock.now
	secret, k := createKey(t, s, KeySpec{Name: "ci", ExpiresIn: 30 * 24 * time.Hour})
	if want := created.Add(30 * 24 * time.Hour); !k.ExpiresAt.Equal(want) {
		t.Errorf("CreateKey(30d).ExpiresAt = %v, want %v", k.ExpiresAt, want)
	}
	if _, err := s.Authenticate(ctx, secret); err != nil {
		t.Fatalf("Authenticate(before expiry) = %v", err)
	}
	clock.advance(30 * 24 * time.Hour)
	_, err := s.Authenticate(ctx, secret)
	if !errdefs.Is(err, errdefs.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("Authenticate(after expiry) = %v, want Unauthenticated saying it expired", err)
	}
	// A wrong secret of the same ID learns nothing about expiry.
	wrong := secret[:len(secret)-1] + map[bool]string{true: "b", false: "a"}[secret[len(secret)-1] == 'a']
	if _, err := s.Authenticate(ctx, wrong); err == nil || strings.Contains(err.Error(), "expired") {
		t.Errorf("Authenticate(wrong secret of an expired key) = %v, want the plain refusal", err)
	}
	keys, err := s.ListKeys(ctx)
	if err != nil || len(keys) != 1 || !keys[0].ExpiresAt.Equal(k.ExpiresAt) {
		t.Errorf("ListKeys() = %+v, %v, want the key with its expiry", keys, err)
	}
	for _, d := range []time.Duration{-time.Second, MaxKeyLifetime + time.Hour} {
		if _, _, err := s.CreateKey(ctx, KeySpec{ExpiresIn: d}); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("CreateKey(expires in %s) = %v, want InvalidArgument", d, err)
		}
	}
}

func TestProjectLimits(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	p, err := s.GetProject(ctx, "rl-team")
	if want := defaultProject("rl-team"); err != nil || !cmp.Equal(p, want) {
		t.Errorf("GetProject(never set) = %+v, %v, want the defaults %+v", p, err, want)
	}
	mem, n, ttl := int64(200<<30), int64(2000), 48*time.Hour
	p, err = s.SetProjectLimits(ctx, "rl-team", LimitsUpdate{MemoryBytes: &mem, Sandboxes: &n})
	if err != nil || p.Limits != (ProjectLimits{MemoryBytes: mem, Sandboxes: n, MaxTTL: DefaultMaxTTL}) {
		t.Errorf("SetProjectLimits(memory, sandboxes) = %+v, %v", p.Limits, err)
	}
	// Only what is given changes.
	p, err = s.SetProjectLimits(ctx, "rl-team", LimitsUpdate{MaxTTL: &ttl})
	want := ProjectLimits{MemoryBytes: mem, Sandboxes: n, MaxTTL: ttl}
	if err != nil || p.Limits != want {
		t.Errorf("SetProjectLimits(max TTL) = %+v, %v, want %+v", p.Limits, err, want)
	}
	// The cached default was forgotten by the write.
	if p, err := s.GetProject(ctx, "rl-team"); err != nil || p.Limits != want {
		t.Errorf("GetProject() after SetProjectLimits = %+v, %v, want %+v", p.Limits, err, want)
	}
	// Another Store sees it too.
	o := NewStore(shared.Client(), StoreConfig{})
	o.prefix = s.prefix
	if p, err := o.GetProject(ctx, "rl-team"); err != nil || p.Limits != want {
		t.Errorf("GetProject(other store) = %+v, %v, want %+v", p.Limits, err, want)
	}
	zero := int64(0)
	if p, err := s.SetProjectLimits(ctx, "rl-team", LimitsUpdate{MemoryBytes: &zero}); err != nil || p.Limits.MemoryBytes != 0 {
		t.Errorf("SetProjectLimits(memory 0) = %+v, %v, want no memory limit", p.Limits, err)
	}
	ps, err := s.ListProjects(ctx)
	if err != nil || len(ps) != 1 || ps[0].Name != "rl-team" {
		t.Errorf("ListProjects() = %+v, %v, want rl-team", ps, err)
	}
	neg, long, short := int64(-1), MaxMaxTTL+time.Hour, time.Millisecond
	for _, u := range []LimitsUpdate{{MemoryBytes: &neg}, {Sandboxes: &neg}, {MaxTTL: &long}, {MaxTTL: &short}} {
		if _, err := s.SetProjectLimits(ctx, "rl-team", u); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("SetProjectLimits(%+v) = %v, want InvalidArgument", u, err)
		}
	}
	if _, err := s.GetProject(ctx, "Bad/Name"); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("GetProject(Bad/Name) = %v, want InvalidArgument", err)
	}
}

// TestGetImageCached: a write through any Store is seen within
// RevocationWindow (made private, deleted).
func TestGetImageCached(t *testing.T) {
	t.Parallel()
	ctx := testCtx(t)
	s := newTestStore(t, StoreConfig{})
	o := NewStore(shared.Client(), StoreConfig{})
	o.prefix = s.prefix
	layers := putLayers(t, s, "x")
	ref := Ref{Name: "app", Tag: "v1"}
	if _, err := s.WriteImage(ctx, Image{Name: "app", Tag: "v1", Layers: layers}, ImageWrite{By: victimP, Public: ptr(true)}); err != nil {
		t.Fatal(err)
	}
	if img, err := o.GetImageCached(ctx, ref); err != nil || !img.Public {
		t.Fatalf("GetImageCached = %+v, %v, want the public image", img, err)
	}
	if _, err := s.SetImagePublic(ctx, ref, false, victimP); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		img, err := o.GetImageCached(ctx, ref)
		if err != nil {
			t.Fatal(err)
		}
		if !img.Public {
			break
		}
		if time.Since(start) > time.Second {
			t.Fatalf("an image made private through another Store still cached public after %s", time.Since(start))
		}
		time.Sleep(5 * time.Millisecond)
	}
	if _, err := s.DeleteImage(ctx, ref, victimP); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetImageCached(ctx, ref); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("GetImageCached(deleted through this Store) = %v, want NotFound", err)
	}
}
