// Package fusion serves SandboxFusion's run_code HTTP API on top of dsec
// sandboxes, so that code-judge rewards written against SandboxFusion
// (veRL, SkyRL, …) run against dsec unchanged.
//
// It is an ordinary client of the dsec API (through the Go SDK) under one
// API key, Config.Client's; dsec up gives it a service key of the reserved
// project internal/project.SandboxFusion, which no tenant's or admin's key
// can see into, so nobody can reach the pool's sandboxes to plant files or
// processes for a later call. Every call gets a sandbox of its own, from a small pool of
// sandboxes created ahead per image and memory limit: the call writes its
// files and code into the working directory, compiles if the language
// needs it, runs, reads back the files asked for, and the sandbox is
// deleted in the background while the pool makes a new one. No call sees
// another's files or processes, and nothing of a call is left behind.
//
// Invariants:
//   - A sandbox serves at most one call, and is deleted after it whatever
//     happened: the pool hands out only sandboxes that never ran a call,
//     and never takes one back. The pool's sandboxes carry the label
//     LabelKey=<node> so that a restarted server deletes those a crash
//     left behind.
//   - A key a client sends only admits its call (Config.Authenticate); the
//     call runs in the server's sandboxes whatever the key.
//   - Paths in files and fetch_files stay inside the working directory
//     (CleanPath), and the sandbox's file API resolves them in the
//     sandbox's own root, so neither can reach anything else.
package fusion

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Language says how to run one language: the image of its sandboxes, the
// file the code is written to in the working directory, and the commands
// (argv, run in the working directory) that compile and run it.
type Language struct {
	Image string
	// Source is the code's file name, relative to the working directory.
	Source string
	// Compile, when set, runs first under compile_timeout; Run runs only
	// if it exits 0.
	Compile []string
	Run     []string
}

// Default image names of the languages (build them with
// `dsec image build NAME --debian …`, see the docs).
const (
	DefaultPythonImage = "sandboxfusion/python"
	DefaultBashImage   = "sandboxfusion/bash"
	DefaultGoImage     = "sandboxfusion/go"
)

// DefaultLanguages returns the languages served by default, as
// SandboxFusion's runners run them.
func DefaultLanguages() map[string]Language {
	return map[string]Language{
		"python": {Image: DefaultPythonImage, Source: "main.py", Run: []string{"python3", "main.py"}},
		"bash":   {Image: DefaultBashImage, Source: "main.sh", Run: []string{"/bin/bash", "main.sh"}},
		"go": {
			Image: DefaultGoImage, Source: "main.go",
			Compile: []string{"go", "build", "-o", "out", "main.go"}, Run: []string{"./out"},
		},
	}
}

// WorkDir is the working directory of every call in its sandbox.
const WorkDir = "/workspace"

// LabelKey labels the sandboxes the server creates; its value is
// Config.Node.
const LabelKey = "dsec-sandboxfusion"

// Config configures a Server. Client is required; zero fields take the
// documented defaults.
type Config struct {
	// Client calls the dsec API; its key decides whose sandboxes these are,
	// and should be one no other client holds (dsec up's is a service key
	// of a reserved project): whoever can reach the pool's sandboxes can
	// plant what later calls see.
	Client *dsec.Client
	// Languages by name (default DefaultLanguages).
	Languages map[string]Language
	// PoolSize is how many ready sandboxes each image keeps (default 4;
	// negative: none, every call creates its sandbox).
	PoolSize int
	// Memory is the sandboxes' memory limit when a call sets no
	// memory_limit_MB (default 1 GiB); CPUs their CPU cap (default 1).
	Memory int64
	CPUs   float64
	// OutputLimit caps each of stdout and stderr of a command (default
	// 1 MiB, SandboxFusion's); past it the command runs on, the rest is
	// dropped, and the result flags it.
	OutputLimit int64
	// MaxConcurrent calls run at once; more wait (default 32).
	MaxConcurrent int
	// MaxBodyBytes limits a request body (default 64 MiB).
	MaxBodyBytes int64
	// MaxTimeout caps compile_timeout and run_timeout (default 15 min).
	MaxTimeout time.Duration
	// CapacityWait is how long a call waits for room on the platform
	// when it is full (default 2 min; negative: not at all).
	CapacityWait time.Duration
	// Authenticate checks a dsec API key a client sent, as
	// `Authorization: Bearer <key>` or as the first segment of the path
	// (/<key>/run_code, for SandboxFusion clients that only take a URL):
	// nil admits the call. An error of kind Unauthenticated or
	// PermissionDenied (internal/errdefs) refuses it with HTTP 401 or 403;
	// any other says the key could not be checked (503). When nil, no key
	// is accepted. Whatever the key, the call runs in the server's own
	// sandboxes (those of Client's key): a key admits a call, it does not
	// choose where it runs.
	Authenticate func(ctx context.Context, key string) error
	// RequireKey refuses calls without a key (HTTP 401); it needs
	// Authenticate. Without it a call may come without a key, as
	// SandboxFusion's clients send none, but a key sent is still checked.
	RequireKey bool
	// Node is the value of the label on the server's sandboxes (default
	// "default").
	Node   string
	Logger *slog.Logger
}

// Server serves the SandboxFusion API. Start it, serve Handler, Close it.
type Server struct {
	cfg Config
	log *slog.Logger
	sem chan struct{}
	met *metrics
	// newSandbox creates a sandbox (create; tests replace it).
	newSandbox func(ctx context.Context, key poolKey) (*dsec.Sandbox, error)
	// deleteSandbox deletes one (sb.Delete; tests replace it).
	deleteSandbox func(ctx context.Context, sb *dsec.Sandbox) error
	ctx           context.Context // ends at Close; owns the pools and deletions
	stop          context.CancelFunc
	wg            sync.WaitGroup // pools' goroutines and deletions

	mu     sync.Mutex
	pools  map[poolKey]*pool // guarded by mu
	closed bool              // guarded by mu
}

// maxPools bounds the pools for memory limits other than the default one;
// past it calls create their sandboxes themselves.
const maxPools = 16

// poolMaxAge is how long a ready sandbox may wait for a call (its TTL is
// an hour).
const poolMaxAge = 40 * time.Minute

// New returns a server for cfg; Start begins filling its pools.
func New(cfg Config) (*Server, error) {
	if cfg.Client == nil {
		return nil, errors.New("fusion: Config.Client is required")
	}
	if cfg.RequireKey && cfg.Authenticate == nil {
		return nil, errors.New("fusion: Config.RequireKey needs Config.Authenticate")
	}
	if cfg.Languages == nil {
		cfg.Languages = DefaultLanguages()
	}
	for name, l := range cfg.Languages {
		if l.Image == "" || l.Source == "" || len(l.Run) == 0 {
			return nil, fmt.Errorf("fusion: language %q needs an image, a source file name and a run command", name)
		}
	}
	if cfg.PoolSize == 0 {
		cfg.PoolSize = 4
	}
	if cfg.Memory <= 0 {
		cfg.Memory = 1 << 30
	}
	if cfg.CPUs <= 0 {
		cfg.CPUs = 1
	}
	if cfg.OutputLimit <= 0 {
		cfg.OutputLimit = 1 << 20
	}
	if cfg.MaxConcurrent <= 0 {
		cfg.MaxConcurrent = 32
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 64 << 20
	}
	if cfg.MaxTimeout <= 0 {
		cfg.MaxTimeout = 15 * time.Minute
	}
	if cfg.CapacityWait == 0 {
		cfg.CapacityWait = 2 * time.Minute
	}
	if cfg.Node == "" {
		cfg.Node = "default"
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	ctx, stop := context.WithCancel(context.Background())
	s := &Server{
		cfg: cfg, log: cfg.Logger, sem: make(chan struct{}, cfg.MaxConcurrent), met: newMetrics(),
		ctx: ctx, stop: stop, pools: make(map[poolKey]*pool),
	}
	s.newSandbox = s.create
	s.deleteSandbox = func(ctx context.Context, sb *dsec.Sandbox) error { return sb.Delete(ctx) }
	return s, nil
}

// Start deletes the sandboxes an earlier server on this node left behind,
// then fills a pool for each language's image, in the background.
func (s *Server) Start() {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(s.ctx, time.Minute)
		ids, err := s.cfg.Client.DeleteSelector(ctx, map[string]string{LabelKey: s.cfg.Node})
		cancel()
		if err != nil && s.ctx.Err() == nil {
			s.log.Warn("sandboxfusion: delete sandboxes left by an earlier run", "err", err)
		} else if len(ids) > 0 {
			s.log.Info("sandboxfusion: deleted sandboxes left by an earlier run", "count", len(ids))
		}
		names := make([]string, 0, len(s.cfg.Languages))
		for name := range s.cfg.Languages {
			names = append(names, name)
		}
		sort.Strings(names)
		for _, name := range names {
			s.pool(poolKey{image: s.cfg.Languages[name].Image, memory: s.cfg.Memory})
		}
	}()
}

// Close stops the pools, deletes their sandboxes and waits for every
// deletion, or until ctx ends.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.stop()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("sandboxfusion: sandboxes still being deleted: %w", ctx.Err())
	}
}

// pool returns the pool of key, making it if there is room; nil when the
// server is closed, pools are off, or there are too many.
func (s *Server) pool(key poolKey) *pool {
	if s.cfg.PoolSize < 0 {
		return nil
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil
	}
	if p, ok := s.pools[key]; ok {
		return p
	}
	if len(s.pools) >= maxPools {
		return nil
	}
	p := newPool(key, s.cfg.PoolSize, poolMaxAge, key.memory == s.cfg.Memory, s.newSandbox, s.discard, s.log)
	s.pools[key] = p
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		p.run(s.ctx)
	}()
	return p
}

// create makes a sandbox for key.
func (s *Server) create(ctx context.Context, key poolKey) (*dsec.Sandbox, error) {
	return s.cfg.Client.Create(ctx, dsec.CreateOptions{
		Image: key.image, Memory: key.memory, CPUs: s.cfg.CPUs,
		Labels: map[string]string{LabelKey: s.cfg.Node},
		TTL:    time.Hour, IdleTTL: time.Hour,
	})
}

// discard deletes sb in the background.
func (s *Server) discard(sb *dsec.Sandbox) {
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := s.deleteSandbox(ctx, sb); err != nil && !errors.Is(err, dsec.ErrNotFound) {
			s.log.Warn("sandboxfusion: delete a used sandbox (its TTL will end it)", "sandbox", sb.ID, "err", err)
		}
	}()
}

// sandbox returns a sandbox for one call: from the pool, or a new one.
// While the platform is full (ResourceExhausted) or unreachable
// (Unavailable) it retries, after the server's retry hint, for up to
// CapacityWait: SandboxFusion clients expect a call to run, not to be
// turned away by a passing burst.
func (s *Server) sandbox(ctx context.Context, key poolKey) (*dsec.Sandbox, error) {
	deadline := time.Now().Add(s.cfg.CapacityWait)
	for {
		var sb *dsec.Sandbox
		var err error
		if p := s.pool(key); p != nil {
			sb, err = p.take(ctx)
		} else {
			sb, err = s.newSandbox(ctx, key)
		}
		if err == nil || !errors.Is(err, dsec.ErrResourceExhausted) && !errors.Is(err, dsec.ErrUnavailable) {
			return sb, err
		}
		wait := time.Second
		var de *dsec.Error
		if errors.As(err, &de) && de.RetryAfter > 0 {
			wait = min(de.RetryAfter, 5*time.Second)
		}
		if time.Now().Add(wait).After(deadline) {
			return nil, err
		}
		s.log.Info("sandboxfusion: a call waits for a sandbox", "image", key.image, "wait", wait, "err", err)
		select {
		case <-ctx.Done():
			return nil, err
		case <-time.After(wait):
		}
	}
}

// Handler serves POST /run_code and GET /v1/ping, also under /<key>/
// (Config.Authenticate).
func (s *Server) Handler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		p, keys := route(r)
		if p != "/run_code" && p != "/v1/ping" {
			writeJSON(w, http.StatusNotFound, map[string]string{"detail": "Not Found: this server answers POST /run_code and GET /v1/ping (or /<key>/run_code)"})
			return
		}
		if !s.admit(w, r, keys) {
			return
		}
		switch p {
		case "/run_code":
			if r.Method != http.MethodPost {
				w.Header().Set("Allow", http.MethodPost)
				writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"detail": "Method Not Allowed: use POST"})
				return
			}
			s.serveRunCode(w, r)
		case "/v1/ping":
			writeJSON(w, http.StatusOK, "pong")
		}
	})
}

// route returns the endpoint a request is for and the keys it sends: its
// bearer key, and the first segment of a path /<key>/<endpoint>.
func route(r *http.Request) (string, []string) {
	var keys []string
	if h := r.Header.Get("Authorization"); h != "" {
		keys = append(keys, strings.TrimSpace(strings.TrimPrefix(h, "Bearer ")))
	}
	p := r.URL.Path
	if p == "/run_code" || p == "/v1/ping" {
		return p, keys
	}
	rest, _ := strings.CutPrefix(p, "/")
	seg, after, found := strings.Cut(rest, "/")
	if found && seg != "" {
		return "/" + after, append(keys, seg)
	}
	return p, keys
}

// admit checks the keys a request sends and answers it when it may not
// go on, in SandboxFusion's error shape ({"detail": …}).
func (s *Server) admit(w http.ResponseWriter, r *http.Request, keys []string) bool {
	if len(keys) == 0 {
		if !s.cfg.RequireKey {
			return true
		}
		w.Header().Set("WWW-Authenticate", `Bearer realm="dsec"`)
		writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "Unauthenticated: this server needs a dsec API key: " +
			"send `Authorization: Bearer <key>`, or call /<key>/run_code (an administrator makes keys with `dsec key create`)"})
		return false
	}
	for _, k := range keys {
		err := errors.New("this server takes no API keys: call it without one")
		if s.cfg.Authenticate != nil {
			err = s.cfg.Authenticate(r.Context(), k)
		}
		switch {
		case err == nil:
			continue
		case errdefs.Is(err, errdefs.ErrPermissionDenied):
			writeJSON(w, http.StatusForbidden, map[string]string{"detail": "Permission denied: " + err.Error()})
		case errdefs.Is(err, errdefs.ErrUnauthenticated) || s.cfg.Authenticate == nil:
			w.Header().Set("WWW-Authenticate", `Bearer realm="dsec"`)
			writeJSON(w, http.StatusUnauthorized, map[string]string{"detail": "Unauthenticated: " + err.Error()})
		default:
			s.log.Warn("sandboxfusion: check an API key", "err", err)
			writeJSON(w, http.StatusServiceUnavailable, map[string]string{"detail": "cannot check the API key now: retry"})
		}
		return false
	}
	return true
}

func (s *Server) serveRunCode(w http.ResponseWriter, r *http.Request) {
	req, err := ParseRequest(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			writeJSON(w, http.StatusRequestEntityTooLarge, map[string]string{"detail": fmt.Sprintf("the request is larger than %d bytes", s.cfg.MaxBodyBytes)})
			return
		}
		writeJSON(w, http.StatusUnprocessableEntity, map[string]string{"detail": err.Error()})
		return
	}
	writeJSON(w, http.StatusOK, s.RunCode(r.Context(), req))
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	b, err := json.Marshal(v)
	if err != nil {
		code, b = http.StatusInternalServerError, []byte(`{"detail":"cannot encode the response"}`)
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_, _ = w.Write(b)
}

// sandboxError is the response of a call that could not run.
func sandboxError(format string, args ...any) *RunCodeResponse {
	return &RunCodeResponse{Status: StatusSandboxError, Message: fmt.Sprintf(format, args...), Files: map[string]string{}}
}

// RunCode runs one request in a sandbox of its own.
func (s *Server) RunCode(ctx context.Context, req *RunCodeRequest) *RunCodeResponse {
	name := ""
	if _, ok := s.cfg.Languages[req.Language]; ok {
		name = req.Language
	}
	var wait time.Duration
	queued := false
	resp := s.runCode(ctx, req, func(d time.Duration) { wait, queued = d, true })
	s.met.observe(name, resp.Status, wait, queued)
	return resp
}

// runCode is RunCode; it calls waited with the time the call waited for a
// slot and a sandbox once it has one.
func (s *Server) runCode(ctx context.Context, req *RunCodeRequest, waited func(time.Duration)) *RunCodeResponse {
	lang, ok := s.cfg.Languages[req.Language]
	if !ok {
		return sandboxError("unknown language %q: this server runs %s", req.Language, strings.Join(s.languageNames(), ", "))
	}
	files, err := InputFiles(req.Files)
	if err != nil {
		return sandboxError("%v", err)
	}
	fetch, err := FetchPaths(req.FetchFiles)
	if err != nil {
		return sandboxError("%v", err)
	}
	compileTimeout, err := s.timeout("compile_timeout", req.CompileTimeout)
	if err != nil {
		return sandboxError("%v", err)
	}
	runTimeout, err := s.timeout("run_timeout", req.RunTimeout)
	if err != nil {
		return sandboxError("%v", err)
	}
	memory := s.cfg.Memory
	if req.MemoryLimitMB > 0 {
		memory = int64(req.MemoryLimitMB) << 20
	}
	archive, err := workTar(files, lang.Source, req.Code)
	if err != nil {
		return sandboxError("%v", err)
	}

	queuedAt := time.Now()
	select {
	case s.sem <- struct{}{}:
		defer func() { <-s.sem }()
	case <-ctx.Done():
		waited(time.Since(queuedAt))
		return sandboxError("the call was canceled while waiting for a free slot: %v", ctx.Err())
	}
	var sb *dsec.Sandbox
	for attempt := 1; ; attempt++ {
		sb, err = s.sandbox(ctx, poolKey{image: lang.Image, memory: memory})
		if attempt == 1 {
			waited(time.Since(queuedAt))
		}
		if err != nil {
			if errors.Is(err, dsec.ErrNotFound) {
				return sandboxError("cannot start a %s sandbox: %v (build the image, and make it public: see `dsec image build --help` and the SandboxFusion docs)", req.Language, err)
			}
			return sandboxError("cannot start a %s sandbox: %v", req.Language, err)
		}
		_, err = sb.UploadTar(ctx, WorkDir, bytes.NewReader(archive), dsec.WithMakeParents())
		if err == nil {
			break
		}
		s.discard(sb)
		// A ready sandbox can be gone (its node's keeper lost it): the
		// call takes another, once.
		if !errors.Is(err, dsec.ErrNotFound) || attempt == 2 {
			return sandboxError("write the code and files into the sandbox: %v", err)
		}
	}
	defer s.discard(sb)

	resp := &RunCodeResponse{Files: map[string]string{}}
	if len(lang.Compile) > 0 {
		resp.CompileResult = s.command(ctx, sb, lang.Compile, nil, compileTimeout)
	}
	if c := resp.CompileResult; c == nil || (c.Status == CommandFinished && c.ReturnCode != nil && *c.ReturnCode == 0) {
		var stdin []byte
		if req.Stdin != nil {
			stdin = []byte(*req.Stdin)
		}
		resp.RunResult = s.command(ctx, sb, lang.Run, stdin, runTimeout)
	}
	for i, p := range fetch {
		data, err := sb.ReadFile(ctx, path.Join(WorkDir, p))
		if err != nil {
			// SandboxFusion returns the files that exist and are regular.
			if !errors.Is(err, dsec.ErrNotFound) && !errors.Is(err, dsec.ErrInvalidArgument) && !errors.Is(err, dsec.ErrFailedPrecondition) {
				s.log.Warn("sandboxfusion: fetch a file", "sandbox", sb.ID, "path", p, "err", err)
			}
			continue
		}
		resp.Files[req.FetchFiles[i]] = base64.StdEncoding.EncodeToString(data)
	}
	resp.Status, resp.Message = Outcome(resp.CompileResult, resp.RunResult)
	return resp
}

// timeout converts a timeout in seconds, refusing those ≤ 0 and capping
// long ones.
func (s *Server) timeout(name string, sec float64) (time.Duration, error) {
	if sec <= 0 {
		return 0, fmt.Errorf("%s is %g: give a positive number of seconds", name, sec)
	}
	d := time.Duration(sec * float64(time.Second))
	if sec > s.cfg.MaxTimeout.Seconds() {
		return 0, fmt.Errorf("%s is %g: at most %g seconds", name, sec, s.cfg.MaxTimeout.Seconds())
	}
	return d, nil
}

func (s *Server) languageNames() []string {
	names := make([]string, 0, len(s.cfg.Languages))
	for n := range s.cfg.Languages {
		names = append(names, n)
	}
	sort.Strings(names)
	return names
}

// command runs argv in the working directory and reports it as
// SandboxFusion does.
func (s *Server) command(ctx context.Context, sb *dsec.Sandbox, argv []string, stdin []byte, timeout time.Duration) *CommandRunResult {
	// The platform kills the command at timeout; the context only guards
	// against a call that never answers.
	cctx, cancel := context.WithTimeout(ctx, timeout+time.Minute)
	defer cancel()
	start := time.Now()
	res, err := sb.Exec(cctx, argv, dsec.WithCwd(WorkDir), dsec.WithStdin(stdin),
		dsec.WithTimeout(timeout), dsec.WithOutputLimit(s.cfg.OutputLimit))
	elapsed := time.Since(start).Seconds()
	if err != nil {
		msg := fmt.Sprintf("run %s: %v", argv[0], err)
		if ctx.Err() == nil {
			s.log.Warn("sandboxfusion: command failed to run", "sandbox", sb.ID, "err", err)
		}
		return &CommandRunResult{Status: CommandError, Stderr: &msg}
	}
	if res.Lost {
		msg := fmt.Sprintf("run %s: the command's end was not observed (the node's keeper restarted)", argv[0])
		return &CommandRunResult{Status: CommandError, Stderr: &msg}
	}
	if res.Duration > 0 {
		elapsed = res.Duration.Seconds()
	}
	stdout, stderr := strings.ToValidUTF8(string(res.Stdout), "\uFFFD"), strings.ToValidUTF8(string(res.Stderr), "\uFFFD")
	out := &CommandRunResult{
		Status: CommandFinished, ExecutionTime: &elapsed, Stdout: &stdout, Stderr: &stderr,
		StdoutTruncated: res.StdoutTruncated, StderrTruncated: res.StderrTruncated,
	}
	switch {
	case res.TimedOut:
		out.Status = CommandTimeLimitExceeded
	case res.Signal != 0:
		rc := -res.Signal
		out.ReturnCode = &rc
	default:
		rc := res.ExitCode
		out.ReturnCode = &rc
	}
	return out
}

// workTar is the tar archive of a call's working directory: its files,
// then the code (which wins over a file of the same name), with the
// directories they need.
func workTar(files []File, source, code string) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mtime := time.Now()
	dirs := map[string]bool{}
	add := func(name string, data []byte) error {
		var parents []string
		for d := path.Dir(name); d != "." && !dirs[d]; d = path.Dir(d) {
			parents = append(parents, d)
		}
		for i := len(parents) - 1; i >= 0; i-- {
			dirs[parents[i]] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: parents[i] + "/", Mode: 0o755, ModTime: mtime}); err != nil {
				return err
			}
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: mtime}); err != nil {
			return err
		}
		_, err := tw.Write(data)
		return err
	}
	for _, f := range files {
		if f.Path == source {
			continue
		}
		if err := add(f.Path, f.Data); err != nil {
			return nil, fmt.Errorf("pack files: %w", err)
		}
	}
	if err := add(source, []byte(code)); err != nil {
		return nil, fmt.Errorf("pack code: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}
