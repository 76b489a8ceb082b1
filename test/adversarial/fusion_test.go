package adversarial

// Attacks on the SandboxFusion API (finding 7 of issue 10): its ready
// sandboxes were in project "default", so any default key listed, execed
// into and planted files in them, and a later run_code call found the
// planted file; and any local user could call it without a key.
//
// The shared platform serves it keyless on loopback (the default), with
// every language in fusionImage (busybox with a /bin/bash, so no Debian
// images need building) and a pool of fusionPool sandboxes.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/fusion"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/testenv"
	"github.com/dsecproject/dsec/internal/testenv/platform"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// fusionImage is the image of every SandboxFusion language on the shared
// platform; fusionPool the ready sandboxes it keeps.
const (
	fusionImage = "adv-sandboxfusion"
	fusionPool  = 2
)

// fusionOptions serves the SandboxFusion API of the shared platform (Env).
func fusionOptions(t testing.TB) func(*platform.Platform) {
	return func(p *platform.Platform) {
		p.FusionAddr = platform.FreePort(t)
		p.Extra = append(p.Extra, "--sandboxfusion-pool", fmt.Sprint(fusionPool), "--sandboxfusion-memory", "64M")
		for _, lang := range []string{"python", "bash", "go"} {
			p.Extra = append(p.Extra, "--sandboxfusion-image", lang+"="+fusionImage)
		}
	}
}

var fusionSuite struct {
	once       sync.Once
	ok         bool
	defaultKey string // a non-admin key of project "default"
}

// Fusion returns the URL of the shared platform's SandboxFusion API once
// its image is built and its pool holds a ready sandbox, and a non-admin
// key of project "default".
func Fusion(t *testing.T) (string, string) {
	t.Helper()
	p := Env(t)
	fusionSuite.once.Do(func() {
		root := testenv.BusyboxRootfs(t)
		// busybox has no bash applet: its ash runs main.sh.
		if err := os.WriteFile(filepath.Join(root, "bin", "bash"), []byte("#!/bin/sh\nexec /bin/sh \"$@\"\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		// Public: the pool's project runs only public images.
		out, errOut, code := p.CLI(t, "", "image", "build", fusionImage, "--public", "--from-dir", root)
		if code != 0 {
			t.Fatalf("dsec image build %s --public = %q, %q, exit %d", fusionImage, out, errOut, code)
		}
		fusionSuite.defaultKey = p.ProjectKey(t, "default")
		// The pool waited for the image; a call that works refills it.
		url := "http://" + p.FusionAddr
		r := runCode(t, url, "", "hostname")
		first := strings.TrimSpace(stdout(r))
		if r.Status != fusion.StatusSuccess || first == "" {
			t.Fatalf("first run_code = %s %q, run_result %s; want Success printing the hostname", r.Status, r.Message, describe(r.RunResult))
		}
		deadline := time.Now().Add(time.Minute)
		for {
			// The first call's sandbox, being deleted, is no ready one.
			ids := slices.DeleteFunc(poolIDs(t), func(id string) bool { return id == first })
			if len(ids) >= fusionPool {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("the SandboxFusion pool holds %d ready sandboxes a minute after its image was built, want %d", len(ids), fusionPool)
			}
			time.Sleep(100 * time.Millisecond)
		}
		fusionSuite.ok = true
	})
	if !fusionSuite.ok {
		t.Fatal("the SandboxFusion API did not come up: see the first test that failed")
	}
	return "http://" + p.FusionAddr, fusionSuite.defaultKey
}

// poolIDs returns the IDs of the SandboxFusion pool's sandboxes: every
// sandbox the node's keeper runs but those an admin key lists without the
// pool's label (what a sandbox of a reserved project is can be told only
// from outside the API, so this works before and after the fix).
func poolIDs(t *testing.T) []string {
	t.Helper()
	p := Env(t)
	kc := keeper.NewClient(p.StateDir)
	defer kc.Close()
	ctx := Ctx(t, 30*time.Second)
	all, err := kc.List(ctx)
	if err != nil {
		t.Fatalf("keeper List = %v", err)
	}
	listed, err := Admin(t).List(ctx, nil)
	if err != nil {
		t.Fatalf("List = %v", err)
	}
	tenants := map[string]bool{}
	for _, sb := range listed {
		if _, ok := sb.Labels[fusion.LabelKey]; !ok {
			tenants[sb.ID] = true
		}
	}
	var ids []string
	for _, sb := range all {
		if !tenants[sb.ID] && sb.State == keeper.StateRunning {
			ids = append(ids, sb.ID)
		}
	}
	return ids
}

// runCode posts code to the bash language of the API at url, with key as
// a bearer key unless it is empty, and decodes the answer.
func runCode(t *testing.T, url, key, code string) *fusion.RunCodeResponse {
	t.Helper()
	status, body := fusionPost(t, url+"/run_code", key, map[string]any{"language": "bash", "code": code, "run_timeout": 30})
	if status != http.StatusOK {
		t.Fatalf("POST /run_code = HTTP %d %s, want 200", status, body)
	}
	var r fusion.RunCodeResponse
	if err := json.Unmarshal(body, &r); err != nil {
		t.Fatalf("run_code answer %s: %v", body, err)
	}
	return &r
}

func fusionPost(t *testing.T, url, key string, req any) (int, []byte) {
	t.Helper()
	b, _ := json.Marshal(req)
	hr, err := http.NewRequestWithContext(Ctx(t, 2*time.Minute), http.MethodPost, url, bytes.NewReader(b))
	if err != nil {
		t.Fatal(err)
	}
	hr.Header.Set("Content-Type", "application/json")
	if key != "" {
		hr.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(hr)
	if err != nil {
		t.Fatalf("POST %s: %v", url, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, body
}

func describe(c *fusion.CommandRunResult) string {
	if c == nil {
		return "none"
	}
	b, _ := json.Marshal(c)
	return string(b)
}

func stdout(r *fusion.RunCodeResponse) string {
	if r.RunResult == nil || r.RunResult.Stdout == nil {
		return ""
	}
	return *r.RunResult.Stdout
}

// fusionAttackers are the keys a hostile tenant or a careless operator
// holds: a non-admin key of project "default" (where the pool once was),
// another project's, and the admin key.
func fusionAttackers(t *testing.T, defaultKey string) map[string]*dsec.Client {
	p := Env(t)
	return map[string]*dsec.Client{
		"default key":  p.Client(t, defaultKey),
		"intruder key": Intruder(t),
		"admin key":    Admin(t),
	}
}

// TestFusionPoolNotPoisoned: what any key plants in the pool's ready
// sandboxes (a file in the working directory and in /tmp, a process) is
// never seen by a later run_code call. Protection: the pool lives in the
// reserved project dsec-sandboxfusion (internal/project), reached only by
// a service key held in dsec up's memory (TestFusionPoolInvisible), and
// it hands out only sandboxes that never ran anything. It runs before
// TestFusionPoolInvisible, whose Delete would empty a pool that is
// reachable.
func TestFusionPoolNotPoisoned(t *testing.T) {
	url, defaultKey := Fusion(t)
	marker := "poison-" + platform.RandHex(4)
	ctx := Ctx(t, 2*time.Minute)
	for _, c := range fusionAttackers(t, defaultKey) {
		for _, id := range poolIDs(t) {
			sb := c.Sandbox(id)
			_ = sb.WriteFile(ctx, fusion.WorkDir+"/main.sh", []byte("echo "+marker), dsec.WithMakeParents())
			_ = sb.WriteFile(ctx, fusion.WorkDir+"/planted", []byte(marker), dsec.WithMakeParents())
			_, _ = sb.Shell(ctx, "echo "+marker+" > /tmp/planted; (sleep 600 &)")
		}
	}
	// More calls than the pool holds, so every planted-in sandbox would
	// be taken by one.
	for i := range fusionPool + 2 {
		r := runCode(t, url, "", "cat "+fusion.WorkDir+"/planted /tmp/planted 2>/dev/null; cat /proc/[0-9]*/comm | grep -c '^sleep$'")
		if out := stdout(r); strings.Contains(out, marker) || strings.TrimSpace(out) != "0" || r.Status != fusion.StatusFailed && r.Status != fusion.StatusSuccess {
			t.Errorf("call %d = %s, stdout %q: want no planted file and no sleep process (0)", i, r.Status, out)
		}
	}
}

// TestFusionPoolInvisible: no API key, not even an admin's, lists, reads,
// writes, execs into, relabels or deletes the SandboxFusion pool's ready
// sandboxes, even knowing their IDs. Protection: the reserved project of
// the pool; the edge shows an admin every project but the reserved ones
// (edge.Caller.sees).
func TestFusionPoolInvisible(t *testing.T) {
	_, defaultKey := Fusion(t)
	ids := poolIDs(t)
	if len(ids) == 0 {
		t.Fatal("no pool sandboxes to attack")
	}
	ctx := Ctx(t, 2*time.Minute)
	for name, c := range fusionAttackers(t, defaultKey) {
		t.Run(strings.ReplaceAll(name, " ", "_"), func(t *testing.T) {
			if sbs, err := c.List(ctx, map[string]string{fusion.LabelKey: Env(t).Node}); err != nil || len(sbs) != 0 {
				t.Errorf("List(%s=%s) = %d sandboxes, %v; want none", fusion.LabelKey, Env(t).Node, len(sbs), err)
			}
			all, err := c.List(ctx, nil)
			if err != nil {
				t.Fatalf("List = %v", err)
			}
			for _, sb := range all {
				if slices.Contains(ids, sb.ID) {
					t.Errorf("List shows the pool's sandbox %s (project %s)", sb.ID, sb.Project)
				}
			}
			for _, id := range ids {
				sb := c.Sandbox(id)
				attacks := []struct {
					op string
					do func() error
				}{
					{"Get", func() error { _, err := c.Get(ctx, id); return err }},
					{"Shell", func() error { _, err := sb.Shell(ctx, "echo planted > /tmp/planted"); return err }},
					{"WriteFile", func() error {
						return sb.WriteFile(ctx, fusion.WorkDir+"/planted", []byte("planted"), dsec.WithMakeParents())
					}},
					{"ReadFile", func() error { _, err := sb.ReadFile(ctx, "/etc/hostname"); return err }},
					{"ListDir", func() error { _, _, err := sb.ListDir(ctx, "/"); return err }},
					{"UploadTar", func() error {
						_, err := sb.UploadTar(ctx, "/tmp", bytes.NewReader(make([]byte, 1024)))
						return err
					}},
					{"UpdateLabels", func() error { return sb.UpdateLabels(ctx, map[string]string{"owned": "1"}) }},
					{"Stats", func() error { _, err := sb.Stats(ctx); return err }},
					{"Delete", func() error { return c.Delete(ctx, id) }},
				}
				for _, a := range attacks {
					if err := a.do(); !errors.Is(err, dsec.ErrNotFound) {
						t.Errorf("%s(%s) = %v, want NotFound", a.op, id, err)
					}
				}
			}
		})
	}
	// Nothing deleted them either: the pool still runs them.
	left := poolIDs(t)
	for _, id := range ids {
		if !slices.Contains(left, id) {
			// A call of another test may have taken it; that is no attack.
			t.Logf("pool sandbox %s went meanwhile", id)
		}
	}
}

// TestFusionCallsIsolated: two consecutive calls never share a sandbox:
// the second sees none of the first's files or processes and runs under
// another hostname (its sandbox ID), and the first's sandbox is deleted.
// Protection: one sandbox per call, deleted after it (internal/fusion).
func TestFusionCallsIsolated(t *testing.T) {
	url, _ := Fusion(t)
	marker := "leak-" + platform.RandHex(4)
	r := runCode(t, url, "", "echo "+marker+" > /tmp/leak; echo "+marker+" > leak.txt; (sleep 600 &); hostname")
	first := strings.TrimSpace(stdout(r))
	if r.Status != fusion.StatusSuccess || first == "" {
		t.Fatalf("first call = %+v, want Success printing its hostname", r)
	}
	for i := range 3 {
		r := runCode(t, url, "", "cat /tmp/leak leak.txt 2>/dev/null; cat /proc/[0-9]*/comm | grep -c '^sleep$'; hostname")
		if out := stdout(r); strings.Contains(out, marker) || strings.Contains(out, first) || !strings.HasPrefix(out, "0\n") {
			t.Errorf("call %d after the first (%s) prints %q: want no files, no processes, another sandbox", i+1, first, out)
		}
	}
	kc := keeper.NewClient(Env(t).StateDir)
	defer kc.Close()
	deadline := time.Now().Add(time.Minute)
	for {
		_, err := kc.Status(Ctx(t, 10*time.Second), first)
		if err != nil {
			break // gone
		}
		if time.Now().After(deadline) {
			t.Errorf("the first call's sandbox %s still runs a minute later", first)
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// TestFusionRequireKey: with dsec up --sandboxfusion-require-key, a call
// without a key, or with a wrong one, is refused with 401 in
// SandboxFusion's error shape, and one with a key (bearer or in the path)
// runs. Protection: the listener's key check (fusion.Server's admit). It
// runs a platform of its own: the shared one serves keyless, the default.
func TestFusionRequireKey(t *testing.T) {
	testenv.RequireRoot(t)
	t.Parallel()
	p := platform.New(t, "advkey", func(p *platform.Platform) {
		p.FusionAddr = platform.FreePort(t)
		p.Extra = append(p.Extra, "--sandboxfusion-require-key", "--sandboxfusion-pool", "0")
	})
	key := p.ProjectKey(t, "default")
	url := "http://" + p.FusionAddr
	// An unknown language answers 200 SandboxError without a sandbox:
	// the call got past the key check.
	call := map[string]any{"language": "cobol", "code": "DISPLAY 'HI'."}
	for _, c := range []struct {
		name, path, key string
		code            int
	}{
		{"no key", "/run_code", "", 401},
		{"wrong key", "/run_code", "dsk_" + strings.Repeat("a", 40), 401},
		{"wrong key in the path", "/dsk_" + strings.Repeat("a", 40) + "/run_code", "", 401},
		{"bearer key", "/run_code", key, 200},
		{"key in the path", "/" + key + "/run_code", "", 200},
	} {
		status, body := fusionPost(t, url+c.path, c.key, call)
		var out map[string]any
		_ = json.Unmarshal(body, &out)
		switch {
		case status != c.code:
			t.Errorf("%s: POST %s = %d %s, want %d", c.name, strings.ReplaceAll(c.path, key, "<key>"), status, body, c.code)
		case c.code == 401 && !strings.HasPrefix(fmt.Sprint(out["detail"]), "Unauthenticated"):
			t.Errorf("%s: 401 body %s, want {\"detail\": \"Unauthenticated: …\"}", c.name, body)
		case c.code == 200 && out["status"] != string(fusion.StatusSandboxError):
			t.Errorf("%s: body %s, want status SandboxError (unknown language)", c.name, body)
		}
	}
	resp, err := http.Get(url + "/v1/ping")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		t.Errorf("GET /v1/ping without a key = %d, want 401", resp.StatusCode)
	}
}

// TestFusionReservedProjectKey: no key can be made for the pool's
// project, or any dsec-… project, through the API or the CLI, even by an
// admin. Protection: cluster's key validation (internal/project.Reserved).
func TestFusionReservedProjectKey(t *testing.T) {
	p := Env(t)
	t.Parallel()
	for _, proj := range []string{"dsec-sandboxfusion", "dsec-other"} {
		for _, admin := range []bool{false, true} {
			if _, k, err := Admin(t).CreateKey(Ctx(t, 30*time.Second), dsec.KeyOptions{Project: proj, Admin: admin}); !errors.Is(err, dsec.ErrInvalidArgument) {
				t.Errorf("CreateKey(project %s, admin %v) = %+v, %v; want InvalidArgument", proj, admin, k, err)
			}
		}
		out, errOut, code := p.CLI(t, "", "key", "create", "--project", proj)
		if code == 0 || strings.Contains(out, "dsk_") || !strings.Contains(errOut, "reserved") {
			t.Errorf("dsec key create --project %s = %q, %q, exit %d; want a refusal saying the project is reserved", proj, out, errOut, code)
		}
	}
}
