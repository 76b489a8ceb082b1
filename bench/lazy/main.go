//go:build linux

// Command lazy measures issue 7's claim for lazy layers: sandboxes that
// read a tenth of their images finish sooner, and write far less to the
// node's disk, when the node fetches layer data from shared storage on
// demand than when it pulls each layer whole before mounting it (DSec
// reports 1.71× sooner and 57% fewer disk writes).
//
// Setup (not timed): a producer `dsec up --lazy-layers` stores -images
// data layers of -size bytes of synthetic files (a few large, many small,
// deterministic pseudo-random) with their lazy forms, and registers each
// as an image over a busybox base. Its blob store is then moved out of
// the state directory to serve as the shared storage, behind `dsec
// blobserver --rate --latency` and a counting proxy. The same state
// directory (so the same etcd: images and layer records) is restarted as
// the node, with an empty local store, once per mode:
//
//   - lazy: `dsec up --blob-source http://proxy --chunk-cache DIR`; the
//     keeper fetches each layer's metadata image whole and its data by
//     chunk, all through the proxy;
//   - eager: `dsec up` without a blob source; before a task creates its
//     sandbox, its image's layers are fetched whole through the same
//     proxy into the node's store (once per layer), then mounted as
//     without lazy layers.
//
// Each mode runs -images × -per-image tasks at -c at once; a task creates
// a sandbox of its image and reads a fixed random tenth (-read) of the
// image's files (cat to /dev/null; a failed read fails the task). By default 80% of what a task
// reads (-shared) is the same for every task of its image — the files of
// an environment that every run touches, as in DSec's trace, where all the
// sandboxes of an image read 4–13% of it in all; -shared 0 makes each
// task choose all its files independently (five tasks then touch ~41%). It prints a table, the three targets and
// JSON, and draws the per-task completion times. Run it as root: `make
// bench-lazy` (or go run ./bench/lazy).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/blobstore"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

const (
	baseImage    = "bench/lazy-base:1"
	cgroupParent = "dsec-bench-lazy"
)

func imageName(i int) string { return fmt.Sprintf("bench/lazy-%d:1", i) }

func main() {
	bin := flag.String("bin", os.Getenv("DSEC_BIN"), "static dsec binary (default $DSEC_BIN)")
	images := flag.Int("images", 10, "distinct images, each with its own data layer")
	perImage := flag.Int("per-image", 5, "sandboxes (tasks) per image")
	size := flag.String("size", "500M", "bytes of files in each image's data layer (K, M, G suffixes)")
	frac := flag.Float64("read", 0.10, "fraction of its image's bytes each task reads")
	shared := flag.Float64("shared", 0.8, "part of each task's reads that every task of its image reads too (0: tasks choose independently)")
	conc := flag.Int("c", 8, "tasks at once")
	rate := flag.String("rate", "200M", "blobserver bandwidth cap, bytes per second (K, M, G suffixes)")
	latency := flag.Duration("latency", 2*time.Millisecond, "blobserver delay before each response")
	order := flag.String("order", "lazy,eager", "which mode runs first: lazy,eager or eager,lazy")
	jsonOut := flag.String("json", "", "also write the JSON here")
	pngOut := flag.String("png", "", "draw the per-task completion times here (PNG)")
	flag.Parse()
	if os.Geteuid() != 0 {
		log.Fatal("run as root: the benchmark creates real sandboxes")
	}
	if *bin == "" {
		log.Fatal("no dsec binary: pass -bin or set DSEC_BIN (make bench-lazy does)")
	}
	if *images < 1 || *perImage < 1 || *conc < 1 || *frac <= 0 || *frac > 1 || *shared < 0 || *shared > 1 {
		log.Fatal("-images, -per-image and -c must be at least 1, -read in (0, 1], -shared in [0, 1]")
	}
	cfg := Config{Images: *images, PerImage: *perImage, ReadFrac: *frac, Shared: *shared, Concurrency: *conc,
		LatencyMs: float64(*latency) / float64(time.Millisecond), Order: *order}
	var err error
	if cfg.Size, err = dsec.ParseSize(*size); err != nil || cfg.Size < 1<<20 {
		log.Fatalf("-size %q: want a size of at least 1M, such as 500M", *size)
	}
	if cfg.Rate, err = dsec.ParseSize(*rate); err != nil || cfg.Rate < 0 {
		log.Fatalf("-rate %q: want a size such as 200M (0: no cap)", *rate)
	}
	modes := strings.Split(*order, ",")
	if len(modes) != 2 || !(modes[0] == modeLazy && modes[1] == modeEager || modes[0] == modeEager && modes[1] == modeLazy) {
		log.Fatalf("-order %q: want lazy,eager or eager,lazy", *order)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	rep := &Report{Date: time.Now().UTC(), CPUs: runtime.NumCPU(), Kernel: kernel(), Config: cfg}
	err = run(ctx, *bin, modes, rep)
	if err != nil {
		rep.Errors = append(rep.Errors, err.Error())
	}
	for _, m := range rep.Modes {
		m.summarize()
	}
	rep.targets()
	writeTable(os.Stdout, rep)
	b, _ := json.MarshalIndent(rep, "", "  ")
	if *jsonOut != "" {
		if werr := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); werr != nil {
			log.Print(werr)
		}
	}
	if *pngOut != "" {
		if perr := writePlot(*pngOut, rep); perr != nil {
			log.Printf("plot: %v", perr)
		} else {
			fmt.Printf("plot: %s\n", *pngOut)
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
	bin    string
	cfg    Config
	dir    string // the run's temporary directory
	state  string // the node's state directory (producer, then node)
	shared string // the shared storage: a blob store directory
	files  [][]file
	base   []string // the base image's layers
	data   []string // each image's data layer
	images map[string]bool
	proxy  *counter
}

// run fills rep as it measures; whatever it made is removed on return.
func run(ctx context.Context, bin string, modes []string, rep *Report) (err error) {
	dir, err := os.MkdirTemp("", "dsec-bench-lazy-")
	if err != nil {
		return err
	}
	b := &bench{bin: bin, cfg: rep.Config, dir: dir, state: filepath.Join(dir, "state"),
		shared: filepath.Join(dir, "shared"), images: map[string]bool{}}
	defer func() {
		// Whatever a failed stop left (mounts, cgroups, loop devices), then
		// the files.
		out, perr := exec.Command(bin, "purge", "--yes", "--state-dir", b.state, "--cgroup-parent", cgroupParent).CombinedOutput()
		if perr != nil {
			log.Printf("dsec purge: %v: %s", perr, out)
		}
		if rerr := os.RemoveAll(dir); rerr != nil && err == nil {
			err = rerr
		}
	}()
	// The sandboxes' (unprivileged) roots must traverse it to their roots.
	if err := os.Chmod(dir, 0o711); err != nil {
		return err
	}
	t0 := time.Now()
	if err := b.produce(ctx, rep); err != nil {
		return fmt.Errorf("setup: %w", err)
	}
	rep.Layers.BuildMs = ms(time.Since(t0))
	log.Printf("setup: %d data layers (%d MiB of images) stored with their lazy forms in %.1f s",
		b.cfg.Images, rep.Layers.ImageBytes>>20, time.Since(t0).Seconds())

	srv, err := b.startBlobserver(ctx)
	if err != nil {
		return err
	}
	defer srv.stop()
	if b.proxy, err = newCounter("http://" + srv.addr); err != nil {
		return err
	}
	defer b.proxy.Close()
	rep.Setup = fmt.Sprintf("the producer's blob store was moved to %s, served by dsec blobserver (--rate %d --latency %s) "+
		"behind a counting proxy; the node restarts the producer's state directory (same etcd) with an empty local store: "+
		"lazy with --blob-source <proxy> (metadata images fetched whole, data by chunk), eager without a blob source after "+
		"fetching each image's layers whole through the proxy", b.shared, b.cfg.Rate, time.Duration(b.cfg.LatencyMs*float64(time.Millisecond)))

	for _, name := range modes {
		m := &Mode{Name: name}
		rep.Modes = append(rep.Modes, m)
		if err := b.runMode(ctx, m, rep); err != nil {
			m.Error = err.Error()
			return fmt.Errorf("%s: %w", name, err)
		}
		log.Printf("%s: %d tasks in %.1f s, fetched %d MiB, read %d MiB, disk %d MiB",
			name, len(m.task), m.WallMs/1e3, m.FetchedBytes>>20, m.ReadBytes>>20, m.DiskWriteBytes>>20)
	}
	return nil
}

// produce builds and stores the images on a producer `dsec up
// --lazy-layers`, stops it and moves its blob store to b.shared.
func (b *bench) produce(ctx context.Context, rep *Report) (err error) {
	d, err := harness.StartDsec(ctx, harness.DsecConfig{Bin: b.bin, StateDir: b.state, CgroupParent: cgroupParent,
		Node: "lazy", Args: []string{"--lazy-layers", "--warm-pool", "0"}})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, d.LogTail(20))
		}
		if serr := d.Stop(context.WithoutCancel(ctx)); serr != nil && err == nil {
			err = serr
		}
	}()
	root := filepath.Join(b.dir, "rootfs")
	if err := harness.Busybox(ctx, root); err != nil {
		return err
	}
	if err := d.BuildImage(ctx, baseImage, root); err != nil {
		return err
	}
	base, err := d.Client.GetImage(ctx, baseImage)
	if err != nil {
		return err
	}
	for _, l := range base.Layers {
		b.base = append(b.base, l.Digest)
		b.images[l.Digest] = true
	}
	pool := newPool()
	b.files = make([][]file, b.cfg.Images)
	b.data = make([]string, b.cfg.Images)
	var mu sync.Mutex
	// Two at once: building is CPU and disk bound.
	err = harness.ForEach(ctx, b.cfg.Images, 2, func(ctx context.Context, i int) error {
		files := layerSpec(i, b.cfg.Size)
		l, err := b.buildUpload(ctx, d.Client, i, files, pool)
		if err != nil {
			return fmt.Errorf("image %d: %w", i, err)
		}
		if _, err := d.Client.CreateImage(ctx, imageName(i), append(append([]string(nil), b.base...), l.Digest), base.Config); err != nil {
			return fmt.Errorf("image %d: %w", i, err)
		}
		mu.Lock()
		defer mu.Unlock()
		b.files[i], b.data[i] = files, l.Digest
		b.images[l.Digest] = true
		rep.Layers.ImageBytes += l.Size
		rep.Layers.Files += len(files)
		for _, f := range files {
			rep.Layers.FileBytes += f.Size
			if f.Large {
				rep.Layers.LargeFiles++
			}
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := d.Stop(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	if err := os.Rename(filepath.Join(b.state, "store"), b.shared); err != nil {
		return fmt.Errorf("move the store to shared storage: %w", err)
	}
	return os.Mkdir(filepath.Join(b.state, "store"), 0o700)
}

// buildUpload builds image i's data layer from its tar stream and uploads
// it; the producer stores it with its lazy form.
func (b *bench) buildUpload(ctx context.Context, c *dsec.Client, i int, files []file, pool []byte) (dsec.Layer, error) {
	f, err := os.CreateTemp(b.dir, "layer-*.erofs")
	if err != nil {
		return dsec.Layer{}, err
	}
	defer os.Remove(f.Name())
	defer f.Close()
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, i, files, pool)) }()
	info, err := layer.BuildFromTar(ctx, pr, f, layer.Options{TempDir: b.dir})
	pr.CloseWithError(io.ErrClosedPipe) // ends the writer if the build stopped early
	if err != nil {
		return dsec.Layer{}, fmt.Errorf("build layer: %w", err)
	}
	if _, err := f.Seek(0, 0); err != nil {
		return dsec.Layer{}, err
	}
	return c.UploadLayer(ctx, f, info.Digest, info.Size)
}

// blobserver is the `dsec blobserver` process serving b.shared.
type blobserver struct {
	cmd    *exec.Cmd
	addr   string
	exited chan error
}

func (b *bench) startBlobserver(ctx context.Context) (*blobserver, error) {
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(b.dir, "blobserver.log"))
	if err != nil {
		return nil, err
	}
	defer logf.Close() // the child has its own descriptor
	cmd := exec.Command(b.bin, "blobserver", "--store", b.shared, "--listen", addr,
		"--rate", strconv.FormatInt(b.cfg.Rate, 10), "--latency", time.Duration(b.cfg.LatencyMs*float64(time.Millisecond)).String())
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start dsec blobserver: %w", err)
	}
	s := &blobserver{cmd: cmd, addr: addr, exited: make(chan error, 1)}
	go func() { s.exited <- cmd.Wait() }()
	url := "http://" + addr + "/blobs/" + strings.Replace(b.base[0], ":", "/", 1)
	if err := harness.WaitHTTPOK(ctx, &http.Client{Timeout: time.Second}, url, 30*time.Second, s.exited); err != nil {
		s.stop()
		return nil, fmt.Errorf("dsec blobserver not ready: %w", err)
	}
	return s, nil
}

// stop ends the blobserver (SIGTERM, then SIGKILL after 10 s).
func (s *blobserver) stop() {
	_ = s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-s.exited:
		s.exited <- err
	case <-time.After(10 * time.Second):
		_ = s.cmd.Process.Kill()
		s.exited <- <-s.exited
	}
}

// runMode starts the node as mode m, runs every task, measures and stops
// the node, leaving its store, chunk cache and metadata images empty.
func (b *bench) runMode(ctx context.Context, m *Mode, rep *Report) (err error) {
	// The node's local data, emptied before and after each mode.
	store, chunks, metas := filepath.Join(b.state, "store"), filepath.Join(b.state, "chunks"), filepath.Join(b.state, "lazy-meta")
	reset := func() error {
		ents, _ := os.ReadDir(store)
		for _, e := range ents {
			if err := os.RemoveAll(filepath.Join(store, e.Name())); err != nil {
				return err
			}
		}
		for _, p := range []string{chunks, metas} {
			if err := os.RemoveAll(p); err != nil {
				return err
			}
		}
		return nil
	}
	if err := reset(); err != nil {
		return err
	}
	args := []string{"--warm-pool", "0"}
	if m.Name == modeLazy {
		args = append(args, "--blob-source", b.proxy.URL(), "--chunk-cache", chunks)
	}
	d, err := harness.StartDsec(ctx, harness.DsecConfig{Bin: b.bin, StateDir: b.state, CgroupParent: cgroupParent, Node: "lazy", Args: args})
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			err = fmt.Errorf("%w\n%s", err, d.LogTail(20))
		}
		if serr := d.Stop(context.WithoutCancel(ctx)); serr != nil && err == nil {
			err = serr
		}
		if rerr := reset(); rerr != nil && err == nil {
			err = rerr
		}
	}()
	local, err := blobstore.New(store)
	if err != nil {
		return err
	}
	fetch := &fetcher{url: b.proxy.URL(), store: local, done: map[string]*fetchOnce{}}

	unix.Sync()
	diskBefore := harness.Allocated(b.state)
	b.proxy.take()
	label := map[string]string{"bench": "lazy-" + m.Name}
	var mu sync.Mutex
	unique := map[string]bool{}
	n := b.cfg.Images * b.cfg.PerImage
	t0 := time.Now()
	err = harness.ForEach(ctx, n, b.cfg.Concurrency, func(ctx context.Context, t int) error {
		i, k := t%b.cfg.Images, t/b.cfg.Images // interleaved: the first tasks hit distinct images
		picks := pickTask(i, k, b.files[i], b.cfg.ReadFrac, b.cfg.Shared)
		ts := time.Now()
		if m.Name == modeEager {
			for _, l := range append(append([]string(nil), b.base...), b.data[i]) {
				if err := fetch.get(ctx, l); err != nil {
					return fmt.Errorf("task %d: fetch layer %s: %w", t, l, err)
				}
			}
		}
		sb, err := d.Client.Create(ctx, dsec.CreateOptions{Image: imageName(i), Memory: 256 << 20, Labels: label})
		if err != nil {
			return fmt.Errorf("task %d: create: %w", t, err)
		}
		tc := time.Now()
		read, err := readFiles(ctx, sb, picks)
		if err != nil {
			return fmt.Errorf("task %d (image %d): %w", t, i, err)
		}
		done := time.Now()
		mu.Lock()
		defer mu.Unlock()
		m.task = append(m.task, done.Sub(ts))
		m.create = append(m.create, tc.Sub(ts))
		m.read = append(m.read, done.Sub(tc))
		m.ReadBytes += read
		for _, f := range picks {
			if key := fmt.Sprint(i, f.Path); !unique[key] {
				unique[key] = true
				m.UniqueReadBytes += f.Size
			}
		}
		return nil
	})
	m.WallMs = ms(time.Since(t0))
	if err != nil {
		return err
	}
	unix.Sync()
	m.DiskWriteBytes = harness.Allocated(b.state) - diskBefore
	fetched, reqs := b.proxy.take()
	m.Requests = reqs
	metaSet := map[string]bool{}
	if ents, err := os.ReadDir(metas); err == nil {
		for _, e := range ents {
			metaSet["sha256:"+e.Name()] = true
		}
	}
	for digest, n := range fetched {
		m.FetchedBytes += n
		switch {
		case b.images[digest]:
			m.FetchedImageBytes += n
		case metaSet[digest]:
			m.FetchedMetaBytes += n
		default:
			m.FetchedDataBytes += n
		}
	}
	if m.Name == modeLazy {
		b.lazyForms(&rep.Layers, metaSet)
	}
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Minute)
	defer cancel()
	if _, err := d.Client.DeleteSelector(cctx, label); err != nil {
		return fmt.Errorf("delete the sandboxes: %w", err)
	}
	return nil
}

// lazyForms sums the sizes of the lazy forms' blobs in shared storage:
// the metadata images are those the node fetched (metaSet), the data
// blobs the rest of what is not a layer image.
func (b *bench) lazyForms(ls *LayerStats, metaSet map[string]bool) {
	shared, err := blobstore.New(b.shared)
	if err != nil {
		return
	}
	descs, err := shared.List()
	if err != nil {
		return
	}
	ls.MetaBytes, ls.DataBytes = 0, 0
	for _, d := range descs {
		switch {
		case b.images[d.Digest]:
		case metaSet[d.Digest]:
			ls.MetaBytes += d.Size
		default:
			ls.DataBytes += d.Size
		}
	}
}

// readFiles reads picks in sb and returns the bytes read, checked
// against their sizes.
func readFiles(ctx context.Context, sb *dsec.Sandbox, picks []file) (int64, error) {
	var want int64
	paths := make([]string, len(picks))
	for j, f := range picks {
		want += f.Size
		paths[j] = f.Path
	}
	// cat reads every file to its end (a failed read, such as EIO, is its
	// exit status and stderr); /dev/null costs nothing, where counting the
	// bytes through a pipe (wc -c) took a third of the machine's CPU.
	res, err := sb.Shell(ctx, "cat "+strings.Join(paths, " ")+" >/dev/null")
	if err != nil {
		return 0, fmt.Errorf("read exec: %w", err)
	}
	if res.Code() != 0 || len(res.Stderr) > 0 {
		return 0, fmt.Errorf("read %d files (%d bytes): exit %d: %s", len(picks), want, res.Code(), res.Stderr)
	}
	return want, nil
}

// fetcher pulls layers whole into the node's store through the proxy,
// each once however many tasks wait for it.
type fetcher struct {
	url   string
	store *blobstore.Dir

	mu sync.Mutex
	// guarded by mu
	done map[string]*fetchOnce
}

type fetchOnce struct {
	once sync.Once
	err  error
}

func (f *fetcher) get(ctx context.Context, digest string) error {
	f.mu.Lock()
	o := f.done[digest]
	if o == nil {
		o = &fetchOnce{}
		f.done[digest] = o
	}
	f.mu.Unlock()
	o.once.Do(func() { o.err = f.pull(ctx, digest) })
	return o.err
}

func (f *fetcher) pull(ctx context.Context, digest string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, f.url+"/blobs/"+strings.Replace(digest, ":", "/", 1), nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %s", req.URL, resp.Status)
	}
	_, err = f.store.Put(ctx, resp.Body, digest)
	return err
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
