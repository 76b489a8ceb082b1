package adversarial

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Key and project-limit attacks (issue 10, findings 6 and 9): a key that
// should be gone keeps working; a tenant asks for a sandbox that lives for
// ever, or for more sandboxes and memory than its project is given.
// Protection: revocation is watched by every apiserver (internal/cluster
// cache.go); expiry is checked on every call; the apiserver admits creates
// against the project's limits (internal/apiserver admission.go).

// TestKeyRevokedWithinSecond: a key in use is refused within a second of
// `dsec key revoke`, and `dsec key ls` never shows a secret.
func TestKeyRevokedWithinSecond(t *testing.T) {
	p := Env(t)
	t.Parallel()
	out, errOut, code := p.CLI(t, "", "key", "create", "--name", "adv-revoke", "--project", "advrevoke")
	if code != 0 {
		t.Fatalf("dsec key create = %q, %q, exit %d", out, errOut, code)
	}
	secret := strings.TrimSpace(out)
	c := p.Client(t, secret)
	me, err := c.WhoAmI(Ctx(t, time.Minute))
	if err != nil {
		t.Fatalf("WhoAmI(new key) = %v", err)
	}
	ls, errOut, code := p.CLI(t, "", "key", "ls")
	if code != 0 || !strings.Contains(ls, me.ID) || !strings.Contains(ls, "adv-revoke") || strings.Contains(ls, secret[len("dsk_"):]) {
		t.Errorf("dsec key ls = %q, %q, exit %d; want the key's ID and name and no secret", ls, errOut, code)
	}
	js, _, code := p.CLI(t, "", "key", "ls", "-o", "json")
	var keys []map[string]any
	if err := json.Unmarshal([]byte(js), &keys); code != 0 || err != nil || strings.Contains(js, secret[len("dsk_"):]) {
		t.Errorf("dsec key ls -o json = %q, exit %d, %v; want a JSON list without secrets", js, code, err)
	}
	// The key in use: one call after another while it is revoked.
	done := make(chan time.Time, 1)
	go func() {
		_, _, code := p.CLI(t, "", "key", "revoke", me.ID)
		if code != 0 {
			t.Errorf("dsec key revoke %s: exit %d", me.ID, code)
		}
		done <- time.Now()
	}()
	var revoked time.Time
	for {
		_, err := c.WhoAmI(Ctx(t, time.Minute))
		select {
		case revoked = <-done:
		default:
		}
		if errors.Is(err, dsec.ErrUnauthenticated) {
			break
		}
		if err != nil {
			t.Fatalf("WhoAmI = %v", err)
		}
		if !revoked.IsZero() && time.Since(revoked) > time.Second {
			t.Fatalf("a revoked key still works %s after `dsec key revoke` returned", time.Since(revoked))
		}
		time.Sleep(10 * time.Millisecond)
	}
	if ls, _, _ := p.CLI(t, "", "key", "ls"); strings.Contains(ls, me.ID) {
		t.Errorf("dsec key ls after revoke = %q, still lists %s", ls, me.ID)
	}
	// Only admin keys manage keys.
	other := p.ProjectKey(t, "advrevoke-user")
	if out, errOut, code := p.CLI(t, "", "key", "ls", "--api-key", other); code == 0 || !strings.Contains(errOut, "only admin keys") {
		t.Errorf("dsec key ls with a user key = %q, %q, exit %d; want a refusal: only admin keys list keys", out, errOut, code)
	}
}

// TestKeyExpired: a key created with --expires is refused, saying it
// expired, once its time is up.
func TestKeyExpired(t *testing.T) {
	p := Env(t)
	t.Parallel()
	out, errOut, code := p.CLI(t, "", "key", "create", "--project", "advexpire", "--expires", "2s")
	if code != 0 {
		t.Fatalf("dsec key create --expires 2s = %q, %q, exit %d", out, errOut, code)
	}
	c := p.Client(t, strings.TrimSpace(out))
	me, err := c.WhoAmI(Ctx(t, time.Minute))
	if err != nil {
		t.Fatalf("WhoAmI(fresh key) = %v", err)
	}
	time.Sleep(time.Until(me.ExpiresAt) + 50*time.Millisecond)
	_, err = c.WhoAmI(Ctx(t, time.Minute))
	if !errors.Is(err, dsec.ErrUnauthenticated) || !strings.Contains(err.Error(), "expired") {
		t.Errorf("WhoAmI(expired key) = %v, want %v saying it expired", err, dsec.ErrUnauthenticated)
	}
	if _, err := c.Create(Ctx(t, time.Minute), dsec.CreateOptions{Image: "busybox", Memory: 64 << 20}); !errors.Is(err, dsec.ErrUnauthenticated) {
		t.Errorf("Create(expired key) = %v, want %v", err, dsec.ErrUnauthenticated)
	}
}

// TestProjectLimits: a project over its sandbox or memory limit is refused
// with ResourceExhausted naming the project and the limit.
func TestProjectLimits(t *testing.T) {
	p := Env(t)
	t.Parallel()
	const project = "advlimits"
	if out, errOut, code := p.CLI(t, "", "project", "limits", project, "--sandboxes", "2", "--memory", "160M"); code != 0 {
		t.Fatalf("dsec project limits = %q, %q, exit %d", out, errOut, code)
	}
	c := p.Client(t, p.ProjectKey(t, project))
	ctx := Ctx(t, 2*time.Minute)
	newSandbox(t, c, dsec.CreateOptions{}, true) // 64 MiB
	// 64 + 128 MiB is over 160 MiB.
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 128 << 20, Labels: map[string]string{LabelKey: labelValue(t.Name())}})
	if err == nil {
		_ = sb.Delete(ctx)
	}
	if !errors.Is(err, dsec.ErrResourceExhausted) || !strings.Contains(err.Error(), project) || !strings.Contains(err.Error(), "160 MiB") {
		t.Errorf("Create(over the memory limit) = %v, want %v naming %s and 160 MiB", err, dsec.ErrResourceExhausted, project)
	}
	newSandbox(t, c, dsec.CreateOptions{}, true)
	// Three at once on top of the two: none may pass.
	res, err := c.BatchCreate(ctx, dsec.CreateOptions{Image: "busybox", Memory: 16 << 20, Labels: map[string]string{LabelKey: labelValue(t.Name())}}, 3)
	if err != nil {
		t.Fatalf("BatchCreate = %v", err)
	}
	for _, r := range res {
		if r.Sandbox != nil {
			_ = r.Sandbox.Delete(ctx)
		}
		if !errors.Is(r.Err, dsec.ErrResourceExhausted) || !strings.Contains(r.Err.Error(), project) || !strings.Contains(r.Err.Error(), "limit is 2") {
			t.Errorf("BatchCreate item %d over the sandbox limit = %v, want %v naming %s and its limit 2", r.Index, r.Err, dsec.ErrResourceExhausted, project)
		}
	}
	out, _, code := p.CLI(t, "", "project", "limits", project)
	if code != 0 || !strings.Contains(out, "2 (limit 2)") {
		t.Errorf("dsec project limits %s = %q, exit %d; want 2 of 2 sandboxes", project, out, code)
	}
}

// TestTTLAboveMax: a create asking for a TTL of 10,000 years (sent raw,
// as the Go SDK cannot express it), or of 8 days, and a TTL change above
// the maximum are InvalidArgument naming the maximum (7 days).
func TestTTLAboveMax(t *testing.T) {
	p := Env(t)
	t.Parallel()
	key := p.ProjectKey(t, "advttl")
	body := `{"image":"busybox","ttl":"315360000000s","resources":{"memoryBytes":"67108864"},"labels":{"` + LabelKey + `":"` + labelValue(t.Name()) + `"}}`
	req, err := http.NewRequestWithContext(Ctx(t, time.Minute), "POST", p.URL()+"/dsec.sandbox.v1.SandboxService/Create", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Authorization", "Bearer "+key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	msg, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest || !bytes.Contains(msg, []byte("invalid_argument")) || !bytes.Contains(msg, []byte("7d")) {
		t.Errorf("Create(ttl 10,000 years) = %d %s, want 400 invalid_argument naming the maximum 7d", resp.StatusCode, msg)
	}
	c := p.Client(t, key)
	ctx := Ctx(t, time.Minute)
	if sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, TTL: 8 * 24 * time.Hour}); !errors.Is(err, dsec.ErrInvalidArgument) {
		if err == nil {
			_ = sb.Delete(ctx)
		}
		t.Errorf("Create(ttl 8d) = %v, want %v", err, dsec.ErrInvalidArgument)
	}
	sb := newSandbox(t, c, dsec.CreateOptions{}, true)
	if err := sb.SetTimeout(ctx, 0, 30*24*time.Hour); !errors.Is(err, dsec.ErrInvalidArgument) || !strings.Contains(err.Error(), "7d") {
		t.Errorf("SetTimeout(idle 30d) = %v, want %v naming 7d", err, dsec.ErrInvalidArgument)
	}
	if err := sb.Refresh(ctx); err != nil || time.Until(sb.ExpiresAt) > 7*24*time.Hour {
		t.Errorf("sandbox after the refused TTL change: expires %v, %v; want within 7 days", sb.ExpiresAt, err)
	}
}
