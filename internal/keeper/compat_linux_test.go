package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// The compatibility tests: today's client against a keeper of protocol 2
// (a fake that answers with the replies recorded from b56bd3e and decodes
// requests as strictly as that keeper did), and a client of protocol 2
// (raw requests from the recorded bodies, replies decoded into the frozen
// types of v2types_test.go) against today's keeper.

// shortTempDir returns a directory whose socket paths fit sun_path.
func shortTempDir(t *testing.T) string {
	t.Helper()
	dir, err := os.MkdirTemp("", "kc")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}

// serveOn serves h on the keeper socket of stateDir until the test ends.
func serveOn(t *testing.T, stateDir string, h http.Handler) {
	t.Helper()
	l := Layout{StateDir: stateDir}
	if err := os.MkdirAll(l.RunDir(), 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", l.Socket())
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: h}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
}

// v2Keeper is a keeper of protocol 2: it replies with the recorded
// replies, and decodes request bodies into the frozen protocol 2 types
// with unknown fields refused, as b56bd3e's keeper did.
type v2Keeper struct {
	t  *testing.T
	mu sync.Mutex
	// guarded by mu
	got map[string]any // decoded request bodies, by path
}

func (f *v2Keeper) handler() http.Handler {
	mux := http.NewServeMux()
	fixture := func(pattern, name string) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			if strings.HasSuffix(name, "notfound.json") {
				w.WriteHeader(http.StatusNotFound)
			}
			_, _ = w.Write(readFixture(f.t, name))
		})
	}
	body := func(pattern string, v any, status int, reply string) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			dec := json.NewDecoder(r.Body)
			dec.DisallowUnknownFields()
			if err := dec.Decode(v); err != nil {
				w.WriteHeader(http.StatusBadRequest)
				_ = json.NewEncoder(w).Encode(v2WireError{Kind: "invalid argument", Message: "keeper request: " + err.Error()})
				return
			}
			f.mu.Lock()
			f.got[r.URL.Path] = v
			f.mu.Unlock()
			if reply == "" {
				w.WriteHeader(status)
				return
			}
			_, _ = w.Write(readFixture(f.t, reply))
		})
	}
	fixture("GET /v1/version", "version.reply.json")
	mux.HandleFunc("GET /v1/sandbox/status", func(w http.ResponseWriter, r *http.Request) {
		name := "status.reply.json"
		if r.URL.Query().Get("id") != "k11-6cgxz6zc4rba" {
			name = "status.notfound.json"
		}
		w.Header().Set("Content-Type", "application/json")
		if name == "status.notfound.json" {
			w.WriteHeader(http.StatusNotFound)
		}
		_, _ = w.Write(readFixture(f.t, name))
	})
	fixture("GET /v1/sandbox/list", "list.reply.json")
	fixture("GET /v1/sandbox/stats", "stats.reply.json")
	fixture("GET /v1/exec/list", "execlist.reply.json")
	fixture("GET /v1/exec/wait", "wait.reply.json")
	fixture("GET /v1/events", "events.reply.json")
	body("POST /v1/sandbox/create", &v2CreateRequest{}, 0, "status.reply.json")
	body("POST /v1/exec/start", &v2ExecRequest{}, http.StatusNoContent, "")
	body("POST /v1/exec/stdin", &v2StdinRequest{}, http.StatusNoContent, "")
	body("POST /v1/exec/signal", &v2SignalRequest{}, http.StatusNoContent, "")
	body("POST /v1/exec/resize", &v2ResizeRequest{}, http.StatusNoContent, "")
	mux.HandleFunc("POST /v1/sandbox/pack", func(w http.ResponseWriter, r *http.Request) {
		var req v2PackRequest
		dec := json.NewDecoder(r.Body)
		dec.DisallowUnknownFields()
		if err := dec.Decode(&req); err != nil {
			w.WriteHeader(http.StatusBadRequest)
			return
		}
		f.mu.Lock()
		f.got[r.URL.Path] = &req
		f.mu.Unlock()
		w.Header().Set(headerPackDigest, "sha256:00")
		w.Header().Set(headerPackFiles, "3")
		w.Header().Set(headerPackFrozen, "1500000")
		_, _ = w.Write([]byte("erofs"))
	})
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		f.got[r.URL.Path] = r.URL.Query().Get("kill")
		f.mu.Unlock()
		w.WriteHeader(http.StatusNoContent)
	})
	return mux
}

// TestClientAgainstV2Keeper runs today's client against a protocol 2
// keeper: it reads every reply, and every request it sends (using nothing
// newer) is one that keeper reads.
func TestClientAgainstV2Keeper(t *testing.T) {
	dir := shortTempDir(t)
	fake := &v2Keeper{t: t, got: map[string]any{}}
	serveOn(t, dir, fake.handler())
	c := NewClient(dir)
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	v, err := c.Version(ctx)
	if err != nil || v.Protocol != 2 || v.Settings != nil || v.Pid != 25930 {
		t.Errorf("Version() = %+v, %v; want protocol 2 of pid 25930 without settings", v, err)
	}
	running := v2Info
	running.RunningExecs = 1
	info, err := c.Status(ctx, "k11-6cgxz6zc4rba")
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(running, info); diff != "" {
		t.Errorf("Status() (-want +got):\n%s", diff)
	}
	if _, err := c.Status(ctx, "k11-nosuch"); !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Status(unknown) = %v, want NotFound", err)
	}
	if list, err := c.List(ctx); err != nil || len(list) != 1 || list[0].ID != running.ID {
		t.Errorf("List() = %+v, %v; want the one sandbox", list, err)
	}
	if st, err := c.Stats(ctx, running.ID); err != nil || st.MemoryLimit != 64<<20 {
		t.Errorf("Stats() = %+v, %v; want a 64 MiB limit", st, err)
	}
	if execs, err := c.ListExecs(ctx, running.ID); err != nil || len(execs) != 2 || !execs[1].Running || execs[0].Exit == nil || execs[0].Exit.Code != 3 {
		t.Errorf("ListExecs() = %+v, %v; want one that exited 3 and one running", execs, err)
	}
	if st, err := c.WaitExec(ctx, running.ID, "xmr5housfiq24yty"); err != nil || st.Code != 3 {
		t.Errorf("WaitExec() = %+v, %v; want code 3", st, err)
	}
	if evs, cur, err := c.Events(ctx, ""); err != nil || len(evs) != 2 || evs[0].Type != EventOOM || cur != "c060e43194c8:2" {
		t.Errorf("Events() = %+v, %q, %v; want the OOM and the exit", evs, cur, err)
	}

	// Requests: what the client sends decodes, strictly, into protocol 2's
	// messages with the same meaning.
	create := v2Requests["create.request.json"].(CreateRequest)
	if _, err := c.Create(ctx, create); err != nil {
		t.Errorf("Create() = %v", err)
	}
	exec := v2Requests["exec.start.request.json"].(ExecRequest)
	if err := c.StartExec(ctx, exec); err != nil {
		t.Errorf("StartExec() = %v", err)
	}
	stdin := v2Requests["exec.stdin.request.json"].(StdinRequest)
	if err := c.WriteStdin(ctx, stdin); err != nil {
		t.Errorf("WriteStdin() = %v", err)
	}
	sig := v2Requests["exec.signal.request.json"].(SignalRequest)
	if err := c.Signal(ctx, sig); err != nil {
		t.Errorf("Signal() = %v", err)
	}
	rs := v2Requests["exec.resize.request.json"].(ResizeRequest)
	if err := c.Resize(ctx, rs); err != nil {
		t.Errorf("Resize() = %v", err)
	}
	pk, err := c.PackDiff(ctx, v2Requests["pack.request.json"].(PackRequest))
	if err != nil || pk.Digest != "sha256:00" || pk.Files != 3 || pk.Frozen != 1500*time.Microsecond || pk.Size != 5 {
		t.Errorf("PackDiff() = %+v, %v", pk, err)
	} else {
		pk.Body.Close()
	}
	if err := c.Shutdown(ctx, false); err != nil {
		t.Errorf("Shutdown(false) = %v", err)
	}
	want := map[string]any{}
	for path, name := range map[string]string{
		"/v1/sandbox/create": "create.request.json", "/v1/exec/start": "exec.start.request.json",
		"/v1/exec/stdin": "exec.stdin.request.json", "/v1/exec/signal": "exec.signal.request.json",
		"/v1/exec/resize": "exec.resize.request.json", "/v1/sandbox/pack": "pack.request.json",
	} {
		// What a protocol 2 client sent for the same call.
		var v any
		switch path {
		case "/v1/sandbox/create":
			v = &v2CreateRequest{}
		case "/v1/exec/start":
			v = &v2ExecRequest{}
		case "/v1/exec/stdin":
			v = &v2StdinRequest{}
		case "/v1/exec/signal":
			v = &v2SignalRequest{}
		case "/v1/exec/resize":
			v = &v2ResizeRequest{}
		case "/v1/sandbox/pack":
			v = &v2PackRequest{}
		}
		if err := decodeStrict(readFixture(t, name), v); err != nil {
			t.Fatal(err)
		}
		want[path] = v
	}
	want["/v1/shutdown"] = ""
	fake.mu.Lock()
	defer fake.mu.Unlock()
	if diff := cmp.Diff(want, fake.got); diff != "" {
		t.Errorf("requests a protocol 2 keeper decoded (-what a protocol 2 client sent +what this client sent):\n%s", diff)
	}
}

// newTestKeeper returns a keeper with no driver behind it: enough for the
// API's reads and for requests refused before anything is started. It
// holds the recorded sandbox k11-6cgxz6zc4rba with its two execs (one
// ended, one whose end no keeper saw) and two events.
func newTestKeeper(t *testing.T) (*Keeper, string) {
	t.Helper()
	dir := shortTempDir(t)
	cfg := Config{StateDir: dir, Version: "test", Runtime: "/usr/bin/crun", OutputQuota: 256 << 20}
	k := &Keeper{cfg: cfg, l: Layout{StateDir: dir}, log: discardLogger(), boxes: map[string]*box{}, events: newEventLog(), vault: newVault(), settings: cfg.Settings()}
	k.ct = &containerDriver{k: k, cfg: &k.cfg, l: k.l, log: k.log}
	k.ct.warm = newWarmPool(k.ct, 0)
	k.drivers = map[string]Driver{containerDriverName: k.ct}
	var info SandboxInfo
	if err := json.Unmarshal(readFixture(t, "sandbox.keeper.json"), &info); err != nil {
		t.Fatal(err)
	}
	k.boxes[info.ID] = k.newBox(info)
	done := filepath.Join(k.l.ExecDir(info.ID, "xmr5housfiq24yty"))
	lost := filepath.Join(k.l.ExecDir(info.ID, "xdowncyxtifq4h7h"))
	for _, d := range []string{done, lost} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			t.Fatal(err)
		}
	}
	files := map[string][]byte{
		filepath.Join(done, "spec.json"): readFixture(t, "exec.spec.json"),
		filepath.Join(done, "exit.json"): readFixture(t, "exec.exit.json"),
		filepath.Join(done, "stdout"):    []byte("out\n"),
		filepath.Join(done, "stderr"):    []byte("err\n"),
		filepath.Join(lost, "spec.json"): []byte(`{"id":"xdowncyxtifq4h7h","argv":["sh","-c","sleep 1000"],"started":"2026-12-01T17:57:51.172849766Z"}`),
		filepath.Join(lost, "stdout"):    nil,
		filepath.Join(lost, "stderr"):    nil,
	}
	for p, b := range files {
		if err := os.WriteFile(p, b, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	k.events.add("k11-2ioc5nvwr4hh", EventOOM, "exec xj6h6t6o45mv4byn killed for memory (limit 32 MiB)")
	k.events.add("k11-p4zx6k2xghsy", EventExited, "init killed by signal 9 (killed)")
	return k, dir
}

func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// v2Call is a call of a protocol 2 client: no protocol header, a body as
// that client marshalled it, the reply decoded as it decoded replies.
func v2Call(t *testing.T, hc *http.Client, method, path string, body []byte, out any) (int, error) {
	t.Helper()
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://keeper"+path, r)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		var w v2WireError
		_ = json.NewDecoder(resp.Body).Decode(&w)
		return resp.StatusCode, errors.New(w.Kind + ": " + w.Message)
	}
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			t.Fatalf("%s %s: decode reply: %v", method, path, err)
		}
	}
	return resp.StatusCode, nil
}

// TestV2ClientAgainstKeeper runs a protocol 2 client against today's
// keeper: it is told protocol 2 (which it requires), reads the replies,
// and its requests are decoded and acted on.
func TestV2ClientAgainstKeeper(t *testing.T) {
	k, dir := newTestKeeper(t)
	serveOn(t, dir, k.handler(func() {}))
	sock := Layout{StateDir: dir}.Socket()
	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "unix", sock)
	}}}
	defer hc.CloseIdleConnections()

	var v v2Version
	if _, err := v2Call(t, hc, "GET", "/v1/version", nil, &v); err != nil || v.Protocol != 2 {
		t.Errorf("GET /v1/version = %+v, %v; want protocol 2, which a protocol 2 client requires", v, err)
	}
	var want v2SandboxInfo
	if err := json.Unmarshal(readFixture(t, "sandbox.keeper.json"), &want); err != nil {
		t.Fatal(err)
	}
	var info v2SandboxInfo
	if _, err := v2Call(t, hc, "GET", "/v1/sandbox/status?id=k11-6cgxz6zc4rba", nil, &info); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, info); diff != "" {
		t.Errorf("status as a protocol 2 client reads it (-recorded +got):\n%s", diff)
	}
	var list []v2SandboxInfo
	if _, err := v2Call(t, hc, "GET", "/v1/sandbox/list", nil, &list); err != nil || len(list) != 1 || list[0].ID != want.ID {
		t.Errorf("list = %+v, %v; want the one sandbox", list, err)
	}
	var execs []v2ExecInfo
	if _, err := v2Call(t, hc, "GET", "/v1/exec/list?sandbox=k11-6cgxz6zc4rba", nil, &execs); err != nil {
		t.Fatal(err)
	}
	var wantExecs []v2ExecInfo
	if err := json.Unmarshal(readFixture(t, "execlist.lost.reply.json"), &wantExecs); err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(wantExecs, execs); diff != "" {
		t.Errorf("exec list as a protocol 2 client reads it (-recorded +got):\n%s", diff)
	}
	var exit v2ExitRecord
	if _, err := v2Call(t, hc, "GET", "/v1/exec/wait?sandbox=k11-6cgxz6zc4rba&exec=xmr5housfiq24yty&timeout=1s", nil, &exit); err != nil || exit.Code != 3 || exit.StdoutBytes != 4 {
		t.Errorf("wait = %+v, %v; want code 3 and 4 bytes of stdout", exit, err)
	}
	if _, err := v2Call(t, hc, "GET", "/v1/exec/wait?sandbox=k11-6cgxz6zc4rba&exec=xdowncyxtifq4h7h&timeout=1s", nil, &exit); err != nil || !exit.Lost {
		t.Errorf("wait of an exec no keeper saw end = %+v, %v; want lost", exit, err)
	}
	var evs v2EventsReply
	if _, err := v2Call(t, hc, "GET", "/v1/events?cursor=&timeout=1s", nil, &evs); err != nil || len(evs.Events) != 2 || evs.Events[1].Type != "exited" {
		t.Errorf("events = %+v, %v; want the OOM and the exit", evs, err)
	}

	// Requests as a protocol 2 client sent them reach the keeper's logic:
	// each is refused for what it asks, never as a request it cannot read.
	for _, tt := range []struct {
		path, fixture string
		want          int
	}{
		{"/v1/sandbox/create", "create.request.json", http.StatusConflict},   // the sandbox exists
		{"/v1/exec/start", "exec.start.request.json", http.StatusConflict},   // the exec exists
		{"/v1/exec/stdin", "exec.stdin.request.json", http.StatusConflict},   // not running
		{"/v1/exec/signal", "exec.signal.request.json", http.StatusConflict}, // not running
		{"/v1/exec/resize", "exec.resize.request.json", http.StatusConflict}, // not running
		{"/v1/sandbox/pack", "pack.request.json", http.StatusNotFound},       // see below
	} {
		body := readFixture(t, tt.fixture)
		if tt.path == "/v1/sandbox/pack" {
			// Packing needs a sandbox's writable layer; one that does not
			// exist shows the request was read.
			body = bytes.Replace(body, []byte("k11-6cgxz6zc4rba"), []byte("k11-nosuch"), 1)
		}
		code, err := v2Call(t, hc, "POST", tt.path, body, nil)
		if code != tt.want {
			t.Errorf("POST %s (protocol 2 body) = %d %v, want %d", tt.path, code, err, tt.want)
		}
	}
}

// TestKeeperToleratesUnknownFields: a newer client's fields are ignored.
func TestKeeperToleratesUnknownFields(t *testing.T) {
	k, dir := newTestKeeper(t)
	serveOn(t, dir, k.handler(func() {}))
	c := NewClient(dir)
	defer c.Close()
	body := []byte(`{"sandbox":"k11-6cgxz6zc4rba","exec":"xdowncyxtifq4h7h","signal":15,"from_the_future":{"x":1}}`)
	req, _ := http.NewRequest("POST", "http://keeper/v1/exec/signal", bytes.NewReader(body))
	req.Header.Set(headerProtocol, "99")
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var w wireError
	_ = json.NewDecoder(resp.Body).Decode(&w)
	if resp.StatusCode != http.StatusConflict || !strings.Contains(w.Message, "not running") {
		t.Errorf("signal with an unknown field = %d %+v, want 409 (the exec is not running): the request read", resp.StatusCode, w)
	}
}

// TestKeeperVersionNegotiation: a client of this protocol learns the
// keeper's protocol, the oldest it serves and its settings; one older
// than MinProtocol is refused with what to do.
func TestKeeperVersionNegotiation(t *testing.T) {
	k, dir := newTestKeeper(t)
	serveOn(t, dir, k.handler(func() {}))
	c := NewClient(dir)
	defer c.Close()
	ctx := context.Background()
	v, err := c.Version(ctx)
	if err != nil || v.Protocol != Protocol || v.MinProtocol != MinProtocol || v.Settings == nil || v.Settings.Runtime != "/usr/bin/crun" || len(v.Drivers) == 0 {
		t.Errorf("Version() = %+v, %v; want protocol %d, min %d, the settings and drivers", v, err, Protocol, MinProtocol)
	}
	req, _ := http.NewRequest("GET", "http://keeper/v1/sandbox/list", nil)
	req.Header.Set(headerProtocol, "1")
	resp, err := c.http.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusConflict {
		t.Errorf("a protocol 1 client's call = %d, want 409: it is older than MinProtocol", resp.StatusCode)
	}
}

// TestApplySettings: live settings change in the running keeper; others
// are refused, naming them.
func TestApplySettings(t *testing.T) {
	if _, err := FindRuntime(""); err != nil {
		t.Skip("no OCI runtime installed: settings name one")
	}
	k, dir := newTestKeeper(t)
	cur, err := k.cfg.Settings().Normalize(dir)
	if err != nil {
		t.Fatal(err)
	}
	k.settings = cur
	serveOn(t, dir, k.handler(func() {}))
	c := NewClient(dir)
	defer c.Close()
	ctx := context.Background()
	want := cur
	want.WarmPool = 5
	got, err := c.ApplySettings(ctx, want)
	if err != nil || got.WarmPool != 5 || k.ct.warm.size() != 5 {
		t.Errorf("ApplySettings(warm pool 5) = %+v, %v (pool keeps %d); want warm pool 5", got, err, k.ct.warm.size())
	}
	want.ChunkSize = 4 << 20
	if _, err := c.ApplySettings(ctx, want); !errdefs.Is(err, errdefs.ErrFailedPrecondition) || !strings.Contains(err.Error(), "--chunk-size") {
		t.Errorf("ApplySettings(chunk size) = %v, want FailedPrecondition naming --chunk-size", err)
	}
}
