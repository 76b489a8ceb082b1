//go:build linux

package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/internal/nsexec"
	"github.com/dsecproject/dsec/internal/oci"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// rawRuntime drives an OCI runtime (crun or runc) directly, through the
// runner, on bundles made like dsec's (internal/oci.New with the same
// namespaces, id mapping and capabilities) over one shifted copy of the
// busybox tree.
type rawRuntime struct {
	name, path   string
	state        string // --root of the runtime
	bundles      string // where bundles are written
	rootfs       string
	cgroupParent string
	idmap        rootfs.IDMap
	runner       *harness.Runner

	mu sync.Mutex
	// guarded by mu
	live  map[string]bool // containers created and not yet deleted
	round int
}

func newRawRuntime(name, dir, rootfsDir, cgroupParent string, idmap rootfs.IDMap, runner *harness.Runner) (*rawRuntime, error) {
	path, err := exec.LookPath(name)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	r := &rawRuntime{
		name: name, path: path, state: filepath.Join(dir, name+"-state"), bundles: filepath.Join(dir, name+"-bundles"),
		rootfs: rootfsDir, cgroupParent: cgroupParent, idmap: idmap, runner: runner, live: map[string]bool{},
	}
	for _, d := range []string{r.state, r.bundles} {
		if err := os.MkdirAll(d, 0o711); err != nil {
			return nil, err
		}
	}
	return r, nil
}

// writeBundle writes the bundle of container id, running args.
func (r *rawRuntime) writeBundle(id string, args []string) (string, error) {
	b := filepath.Join(r.bundles, id)
	if err := os.MkdirAll(b, 0o711); err != nil {
		return "", err
	}
	spec := oci.New(oci.Options{
		Rootfs: r.rootfs, Hostname: id, Args: args, Env: []string{"PATH=/bin:/sbin:/usr/bin:/usr/sbin"},
		HostUID: r.idmap.HostID, HostGID: r.idmap.HostID, Size: r.idmap.Size,
		CgroupsPath: "/" + r.cgroupParent + "/" + r.name + "-" + id,
		Caps:        nsexec.CapNames(nsexec.DefaultCaps),
	})
	return b, oci.WriteBundle(b, spec)
}

func (r *rawRuntime) cmd(ctx context.Context, args ...string) (harness.RunResult, error) {
	return r.runner.Run(ctx, append([]string{r.path, "--root", r.state}, args...)...)
}

// runOnce times `run` of a container running true, to its end.
func (r *rawRuntime) runOnce(ctx context.Context, i int) (time.Duration, error) {
	b, err := r.writeBundle("true", []string{"/bin/true"})
	if err != nil {
		return 0, err
	}
	res, err := r.cmd(ctx, "run", "--bundle", b, fmt.Sprintf("run-%d", i))
	return res.Elapsed, err
}

// startSleeper starts a container that sleeps, with create and start.
func (r *rawRuntime) startSleeper(ctx context.Context, id string) error {
	b := filepath.Join(r.bundles, id)
	if _, err := os.Stat(b); err != nil {
		if b, err = r.writeBundle(id, sleepArgs); err != nil {
			return err
		}
	}
	if _, err := r.cmd(ctx, "create", "--bundle", b, id); err != nil {
		return err
	}
	r.mu.Lock()
	r.live[id] = true
	r.mu.Unlock()
	_, err := r.cmd(ctx, "start", id)
	return err
}

// execOnce times `exec` of true in a running container.
func (r *rawRuntime) execOnce(ctx context.Context, id string) (time.Duration, error) {
	res, err := r.cmd(ctx, "exec", id, "/bin/true")
	return res.Elapsed, err
}

// deleteAll deletes every container this runtime created, conc at a
// time, and their bundles.
func (r *rawRuntime) deleteAll(ctx context.Context, conc int) error {
	r.mu.Lock()
	ids := make([]string, 0, len(r.live))
	for id := range r.live {
		ids = append(ids, id)
	}
	r.live = map[string]bool{}
	r.mu.Unlock()
	err := harness.ForEach(ctx, len(ids), conc, func(ctx context.Context, i int) error {
		_, err := r.cmd(ctx, "delete", "--force", ids[i])
		if rmErr := os.RemoveAll(filepath.Join(r.bundles, ids[i])); err == nil {
			err = rmErr
		}
		return err
	})
	if err != nil {
		return fmt.Errorf("%s delete: %w", r.name, err)
	}
	return nil
}

var sleepArgs = []string{"/bin/sleep", "86400"}

// rawCreator makes sleeping containers with `create` + `start`, like a
// sandbox that stays up.
type rawCreator struct {
	rt    *rawRuntime
	round string
}

func (c *rawCreator) system() string { return c.rt.name }
func (c *rawCreator) name() string   { return c.rt.name + " create+start (sleep)" }
func (c *rawCreator) roots() []int   { return []int{c.rt.runner.Pid()} }

func (c *rawCreator) prepare(ctx context.Context, count int) error {
	c.rt.mu.Lock()
	c.rt.round++
	c.round = fmt.Sprintf("b%d", c.rt.round)
	c.rt.mu.Unlock()
	// Bundles are written before the clock starts: a user of the raw
	// runtime has them ready too.
	for i := range count {
		if _, err := c.rt.writeBundle(fmt.Sprintf("%s-%d", c.round, i), sleepArgs); err != nil {
			return err
		}
	}
	return nil
}

func (c *rawCreator) create(ctx context.Context, i int) error {
	return c.rt.startSleeper(ctx, fmt.Sprintf("%s-%d", c.round, i))
}

func (c *rawCreator) cleanup(ctx context.Context) error {
	err := c.rt.deleteAll(ctx, 8)
	// Bundles of creates that failed or never ran.
	left, _ := filepath.Glob(filepath.Join(c.rt.bundles, c.round+"-*"))
	for _, b := range left {
		_ = os.RemoveAll(b)
	}
	return err
}
