//go:build linux

// Command layers measures issue 6's claim for composable environments: N
// sandboxes that share a base image and a toolkit, each with its own
// workspace, are ready sooner when the toolkit and the workspaces are
// read-only EROFS layers stacked at create time than when each sandbox is
// created from the base and gets the toolkit and its workspace extracted
// into it from tar archives through the API (DSec reports 1.76×).
//
// It starts a private `dsec up`, builds a busybox base image, generates a
// synthetic toolkit and N workspaces (deterministic pseudo-random files),
// prepares each way once (layers built with internal/layer and uploaded;
// tar archives written), then for each of -rounds runs N sandboxes each
// way at the same concurrency, alternating which goes first, and deletes
// them between runs. Each sandbox is ready when an exec has found its
// workspace's ID file and the toolkit. It prints a table and JSON. Run it
// as root: `make bench-layers` (or go run ./bench/layers).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Where the sandboxes see the toolkit and their workspace.
const (
	toolkitDir   = "/opt/toolkit"
	workspaceDir = "/workspace"
	baseImage    = "bench/base:1"
)

func main() {
	bin := flag.String("bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	n := flag.Int("n", 50, "sandboxes each way, each with its own workspace")
	conc := flag.Int("c", 8, "concurrency of the creates (and of the preparation)")
	rounds := flag.Int("rounds", 1, "runs of N sandboxes each way, alternating which way goes first")
	tkSize := flag.String("toolkit-size", "60M", "bytes of the shared toolkit (K, M, G suffixes)")
	tkFiles := flag.Int("toolkit-files", 2000, "files of the shared toolkit")
	wsSize := flag.String("ws-size", "4M", "bytes of each workspace")
	wsFiles := flag.Int("ws-files", 300, "files of each workspace")
	explicit := flag.Bool("explicit", false, "create the composable sandboxes from explicit layer lists, not registered images bench/ws-I:1")
	jsonOut := flag.String("json", "", "also write the JSON here")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if *bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-layers does)")
	}
	if *n < 1 || *conc < 1 || *rounds < 1 || *tkFiles < 1 || *wsFiles < 1 {
		log.Fatal("-n, -c, -rounds, -toolkit-files and -ws-files must be at least 1")
	}
	cfg := Config{N: *n, Concurrency: *conc, Rounds: *rounds, ToolkitFiles: *tkFiles, WSFiles: *wsFiles, Explicit: *explicit}
	var err error
	if cfg.ToolkitBytes, err = dsec.ParseSize(*tkSize); err != nil || cfg.ToolkitBytes < 0 {
		log.Fatalf("-toolkit-size %q: want a size such as 60M", *tkSize)
	}
	if cfg.WSBytes, err = dsec.ParseSize(*wsSize); err != nil || cfg.WSBytes < 0 {
		log.Fatalf("-ws-size %q: want a size such as 4M", *wsSize)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), Kernel: kernel(), Config: cfg}
	err = run(ctx, *bin, rep)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	rep.ratios()
	writeTable(os.Stdout, rep)
	b, _ := json.MarshalIndent(rep, "", "  ")
	fmt.Println(string(b))
	if *jsonOut != "" {
		if werr := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); werr != nil {
			log.Print(werr)
		}
	}
	if err != nil {
		stop()
		log.Fatal(err) // run has removed everything it made
	}
}

func kernel() string {
	var uts unix.Utsname
	if err := unix.Uname(&uts); err != nil {
		return ""
	}
	return unix.ByteSliceToString(uts.Release[:])
}

// bench is one run's state.
type bench struct {
	d    *harness.Dsec
	c    *dsec.Client
	cfg  Config
	dir  string // the run's temporary directory
	base *dsec.Image

	// src holds the synthetic trees: src/tk/opt/toolkit/… and
	// src/ws-I/workspace/…, each the root of a layer.
	src string
	// The composable way's layer digests (or images), and the tar way's
	// archives.
	tkLayer  string
	wsLayers []string
	tkTar    string
	wsTars   []string
}

// run fills rep as it measures; whatever it made is removed on return.
func run(ctx context.Context, bin string, rep *Report) (err error) {
	dir, err := os.MkdirTemp("", "dsec-bench-layers-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	// The sandboxes' (unprivileged) roots must traverse it to their roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	d, err := harness.StartDsec(ctx, harness.DsecConfig{Bin: bin, StateDir: filepath.Join(dir, "state"), CgroupParent: "dsec-bench-layers"})
	if err != nil {
		return err
	}
	defer func() {
		// Stop ends the keeper with every sandbox and removes the cgroups;
		// the state directory (layers, images) goes with dir.
		if serr := d.Stop(context.WithoutCancel(ctx)); serr != nil && err == nil {
			err = serr
		}
	}()
	b := &bench{d: d, c: d.Client, cfg: rep.Config, dir: dir, src: filepath.Join(dir, "src")}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, d.LogTail(20))
		}
	}()

	root := filepath.Join(dir, "rootfs")
	if err := harness.Busybox(ctx, root); err != nil {
		return err
	}
	if err := d.BuildImage(ctx, baseImage, root); err != nil {
		return err
	}
	if b.base, err = b.c.GetImage(ctx, baseImage); err != nil {
		return err
	}
	t0 := time.Now()
	if rep.Toolkit, rep.Workspace, err = b.generate(ctx); err != nil {
		return err
	}
	log.Printf("generated the toolkit (%d files, %d bytes) and %d workspaces in %.1f s",
		rep.Toolkit.Files, rep.Toolkit.Bytes, rep.Config.N, time.Since(t0).Seconds())

	layers, tarx := &Mode{Name: modeLayers}, &Mode{Name: modeTar}
	rep.Modes = []*Mode{layers, tarx}
	defer func() {
		for _, m := range rep.Modes {
			m.summarize()
		}
	}()
	if err := b.prepLayers(ctx, layers); err != nil {
		return fmt.Errorf("%s: prepare: %w", layers.Name, err)
	}
	log.Printf("%s: prepared in %.1f s (%d bytes of layers)", layers.Name, layers.PrepMs/1e3, layers.PrepBytes)
	if err := b.prepTars(ctx, tarx); err != nil {
		return fmt.Errorf("%s: prepare: %w", tarx.Name, err)
	}
	log.Printf("%s: prepared in %.1f s (%d bytes of tar)", tarx.Name, tarx.PrepMs/1e3, tarx.PrepBytes)

	for r := range rep.Config.Rounds {
		order := []*Mode{layers, tarx}
		if r%2 == 1 {
			order = []*Mode{tarx, layers}
		}
		for _, m := range order {
			rd := b.round(ctx, m.Name, r)
			m.Rounds = append(m.Rounds, rd)
			log.Printf("%s round %d: %d ready in %.1f s, writable %d bytes", m.Name, r, rd.Ready, rd.WallMs/1e3, rd.WritableBytes)
			if rd.Error != "" {
				return fmt.Errorf("%s round %d: %s", m.Name, r, rd.Error)
			}
		}
	}
	return nil
}

// generate writes the toolkit's and the workspaces' trees under b.src.
func (b *bench) generate(ctx context.Context) (tk, ws treeStats, err error) {
	c := b.cfg
	tk, err = genTree(b.treeRoot(-1), treeSpec{seed: 1 << 32, files: c.ToolkitFiles, bytes: c.ToolkitBytes, marker: "toolkit 1\n", markerName: "VERSION"})
	if err != nil {
		return tk, ws, fmt.Errorf("toolkit: %w", err)
	}
	var mu sync.Mutex
	err = harness.ForEach(ctx, c.N, c.Concurrency, func(ctx context.Context, i int) error {
		st, err := genTree(b.treeRoot(i), treeSpec{seed: uint64(i) + 1, files: c.WSFiles, bytes: c.WSBytes, marker: wsID(i), markerName: "ID"})
		if err != nil {
			return fmt.Errorf("workspace %d: %w", i, err)
		}
		if i == 0 {
			mu.Lock()
			ws = st
			mu.Unlock()
		}
		return nil
	})
	return tk, ws, err
}

func wsID(i int) string { return fmt.Sprintf("ws-%d\n", i) }

// layerRoot is the root of the toolkit's layer (i < 0) or of workspace i's;
// treeRoot is where its files are.
func (b *bench) layerRoot(i int) string {
	if i < 0 {
		return filepath.Join(b.src, "tk")
	}
	return filepath.Join(b.src, fmt.Sprintf("ws-%d", i))
}

func (b *bench) treeRoot(i int) string {
	if i < 0 {
		return filepath.Join(b.layerRoot(i), toolkitDir)
	}
	return filepath.Join(b.layerRoot(i), workspaceDir)
}

// prepLayers builds the toolkit's and every workspace's layer, uploads them
// and, unless explicit, registers bench/ws-I:1 = base + toolkit + ws-I.
func (b *bench) prepLayers(ctx context.Context, m *Mode) error {
	out := filepath.Join(b.dir, "layers")
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	defer os.RemoveAll(out) // the node has them now
	t0 := time.Now()
	defer func() { m.PrepMs = ms(time.Since(t0)) }()
	var mu sync.Mutex
	b.wsLayers = make([]string, b.cfg.N)
	err := harness.ForEach(ctx, b.cfg.N+1, b.cfg.Concurrency, func(ctx context.Context, j int) error {
		i := j - 1 // -1 is the toolkit
		l, err := b.buildUpload(ctx, b.layerRoot(i), filepath.Join(out, fmt.Sprintf("%d.erofs", j)))
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		m.PrepBytes += l.Size
		if i < 0 {
			b.tkLayer = l.Digest
		} else {
			b.wsLayers[i] = l.Digest
		}
		return nil
	})
	if err != nil || b.cfg.Explicit {
		return err
	}
	return harness.ForEach(ctx, b.cfg.N, b.cfg.Concurrency, func(ctx context.Context, i int) error {
		_, err := b.c.CreateImage(ctx, wsImage(i), b.layers(i), b.base.Config)
		return err
	})
}

func wsImage(i int) string { return fmt.Sprintf("bench/ws-%d:1", i) }

// layers is the layer list of workspace i's environment, lowest first.
func (b *bench) layers(i int) []string {
	var out []string
	for _, l := range b.base.Layers {
		out = append(out, l.Digest)
	}
	return append(out, b.tkLayer, b.wsLayers[i])
}

// buildUpload builds the EROFS layer of the tree root into the file path
// and uploads it.
func (b *bench) buildUpload(ctx context.Context, root, path string) (dsec.Layer, error) {
	f, err := os.Create(path)
	if err != nil {
		return dsec.Layer{}, err
	}
	defer f.Close()
	info, err := layer.BuildFromDir(ctx, root, f, layer.Options{TempDir: b.dir})
	if err != nil {
		return dsec.Layer{}, fmt.Errorf("build layer of %s: %w", root, err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return dsec.Layer{}, err
	}
	return b.c.UploadLayer(ctx, f, info.Digest, info.Size)
}

// prepTars writes the toolkit's and every workspace's tar archive.
func (b *bench) prepTars(ctx context.Context, m *Mode) error {
	out := filepath.Join(b.dir, "tars")
	if err := os.MkdirAll(out, 0o700); err != nil {
		return err
	}
	t0 := time.Now()
	defer func() { m.PrepMs = ms(time.Since(t0)) }()
	var mu sync.Mutex
	b.wsTars = make([]string, b.cfg.N)
	return harness.ForEach(ctx, b.cfg.N+1, b.cfg.Concurrency, func(ctx context.Context, j int) error {
		i := j - 1
		path := filepath.Join(out, fmt.Sprintf("%d.tar", j))
		size, err := writeTar(b.treeRoot(i), path)
		if err != nil {
			return err
		}
		mu.Lock()
		defer mu.Unlock()
		m.PrepBytes += size
		if i < 0 {
			b.tkTar = path
		} else {
			b.wsTars[i] = path
		}
		return nil
	})
}

// round runs N sandboxes of mode, measures them and deletes them.
func (b *bench) round(ctx context.Context, mode string, round int) *Round {
	r := &Round{Round: round}
	short := "layers"
	if mode == modeTar {
		short = "tar"
	}
	label := map[string]string{"bench": fmt.Sprintf("layers-r%d-%s", round, short)}
	defer func() {
		// Every path: delete what this round made.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
		defer cancel()
		if _, err := b.c.DeleteSelector(cctx, label); err != nil && r.Error == "" {
			r.Error = fmt.Sprintf("delete the sandboxes: %v", err)
		}
	}()
	stateDir := b.d.StateDir()
	memBefore, _ := harness.MemAvailable()
	diskBefore := harness.Allocated(stateDir)

	var mu sync.Mutex
	var sbs []*dsec.Sandbox
	t0 := time.Now()
	err := harness.ForEach(ctx, b.cfg.N, b.cfg.Concurrency, func(ctx context.Context, i int) error {
		ts := time.Now()
		opts := dsec.CreateOptions{Image: baseImage, Labels: label}
		if mode == modeLayers {
			opts.Image = wsImage(i)
			if b.cfg.Explicit {
				cfg := b.base.Config
				opts.Image = ""
				opts.Layers = b.layers(i)
				opts.LayerConfig = &dsec.LayerConfig{Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User}
			}
		}
		sb, err := b.c.Create(ctx, opts)
		if err != nil {
			return fmt.Errorf("sandbox %d: create: %w", i, err)
		}
		mu.Lock()
		sbs = append(sbs, sb)
		mu.Unlock()
		tc := time.Now()
		if mode == modeTar {
			if err := b.fill(ctx, sb, i); err != nil {
				return fmt.Errorf("sandbox %d: %w", i, err)
			}
		}
		tf := time.Now()
		if err := check(ctx, sb, i); err != nil {
			return fmt.Errorf("sandbox %d: %w", i, err)
		}
		done := time.Now()
		mu.Lock()
		defer mu.Unlock()
		r.ready = append(r.ready, done.Sub(ts))
		r.create = append(r.create, tc.Sub(ts))
		r.fill = append(r.fill, tf.Sub(tc))
		return nil
	})
	r.WallMs = ms(time.Since(t0))
	r.Ready = len(r.ready)
	if memAfter, merr := harness.MemAvailable(); merr == nil && memBefore > 0 {
		r.HostMemBytes = memBefore - memAfter
	}
	if err != nil {
		r.Error = err.Error()
		return r
	}
	for _, sb := range sbs {
		st, err := sb.Stats(ctx)
		if err != nil {
			r.Error = fmt.Sprintf("stats of %s: %v", sb.ID, err)
			return r
		}
		r.WritableBytes += st.Disk
		r.SandboxMemBytes += st.Memory
	}
	// Flush the sandboxes' file systems, then their images' blocks.
	unix.Sync()
	unix.Sync()
	r.StateDiskBytes = harness.Allocated(stateDir) - diskBefore
	return r
}

// fill extracts the toolkit's and workspace i's archives into sb.
func (b *bench) fill(ctx context.Context, sb *dsec.Sandbox, i int) error {
	for _, t := range []struct{ tar, dir string }{{b.tkTar, toolkitDir}, {b.wsTars[i], workspaceDir}} {
		f, err := os.Open(t.tar)
		if err != nil {
			return err
		}
		_, err = sb.UploadTar(ctx, t.dir, f, dsec.WithMakeParents())
		f.Close()
		if err != nil {
			return fmt.Errorf("extract into %s: %w", t.dir, err)
		}
	}
	return nil
}

// check runs the exec that makes a sandbox ready: workspace i's ID file
// and the toolkit are there.
func check(ctx context.Context, sb *dsec.Sandbox, i int) error {
	res, err := sb.Shell(ctx, "test -f "+toolkitDir+"/VERSION && cat "+workspaceDir+"/ID")
	if err != nil {
		return fmt.Errorf("check exec: %w", err)
	}
	if res.Code() != 0 || string(res.Stdout) != wsID(i) {
		return fmt.Errorf("check exec: exit %d, stdout %q, want 0 and %q: %s", res.Code(), res.Stdout, wsID(i), res.Stderr)
	}
	return nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
