//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
)

// dockerImage is the tag the busybox tree is imported as.
const dockerImage = "dsec-bench-busybox:latest"

// findDocker returns Debian's dockerd and the docker client installed
// beside it (…/sbin/dockerd, …/bin/docker), else the first docker in PATH.
func findDocker(dockerd, cli string) (string, string, error) {
	if dockerd == "" {
		p, err := exec.LookPath("dockerd")
		if err != nil {
			return "", "", errors.New("docker.io not installed")
		}
		dockerd = p
	}
	if cli == "" {
		sibling := filepath.Join(filepath.Dir(filepath.Dir(dockerd)), "bin", "docker")
		if _, err := os.Stat(sibling); err == nil {
			cli = sibling
		} else if p, err := exec.LookPath("docker"); err == nil {
			cli = p
		} else {
			return "", "", errors.New("docker.io not installed: no docker client")
		}
	}
	return dockerd, cli, nil
}

// dockerDaemon is a dockerd of the benchmark's own: its data and exec
// roots and socket in the temporary directory, no bridge, no iptables,
// its containers under their own cgroup parent. It runs under a runner, so
// that the shims it orphans are reaped.
type dockerDaemon struct {
	cli, host    string
	cgroupParent string
	runner       *harness.Runner
	stop         context.CancelFunc
	done         chan error // receives dockerd's end once
	pidfile      string
	Version      string // the daemon's
	Driver       string // its storage driver
}

func startDocker(ctx context.Context, dir, dockerd, cli, cgroupParent string) (d *dockerDaemon, err error) {
	dir = filepath.Join(dir, "docker")
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return nil, err
	}
	runner, err := harness.StartRunner(harness.RunnerConfig{})
	if err != nil {
		return nil, err
	}
	sock := filepath.Join(dir, "docker.sock")
	d = &dockerDaemon{
		cli: cli, host: "unix://" + sock, cgroupParent: cgroupParent, runner: runner,
		done: make(chan error, 1), pidfile: filepath.Join(dir, "dockerd.pid"),
	}
	dctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	d.stop = stop
	logPath := filepath.Join(dir, "dockerd.log")
	go func() {
		res, err := runner.RunDaemon(dctx, 30*time.Second, dockerd,
			"--iptables=false", "--ip-masq=false", "--bridge=none",
			"--data-root", filepath.Join(dir, "data"), "--exec-root", filepath.Join(dir, "exec"),
			"-H", d.host, "--pidfile", d.pidfile, "--cgroup-parent", cgroupParent,
			"--log-level", "warn")
		_ = os.WriteFile(logPath, []byte(res.Output), 0o600)
		d.done <- err
	}()
	defer func() {
		if err != nil {
			_ = d.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := d.waitReady(ctx, sock); err != nil {
		return d, err
	}
	if out, err := d.docker(ctx, "version", "--format", "{{.Server.Version}}"); err == nil {
		d.Version = strings.TrimSpace(out)
	}
	if out, err := d.docker(ctx, "info", "--format", "{{.Driver}}"); err == nil {
		d.Driver = strings.TrimSpace(out)
	}
	return d, nil
}

func (d *dockerDaemon) waitReady(ctx context.Context, sock string) error {
	client := &http.Client{Timeout: time.Second, Transport: &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var dl net.Dialer
			return dl.DialContext(ctx, "unix", sock)
		},
	}}
	defer client.CloseIdleConnections()
	if err := harness.WaitHTTPOK(ctx, client, "http://docker/_ping", 90*time.Second, d.done); err != nil {
		return fmt.Errorf("dockerd not ready: %w", err)
	}
	return nil
}

// docker runs the docker client against this daemon.
func (d *dockerDaemon) docker(ctx context.Context, args ...string) (string, error) {
	var out bytes.Buffer
	cmd := exec.CommandContext(ctx, d.cli, append([]string{"-H", d.host}, args...)...)
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return out.String(), fmt.Errorf("docker %s: %w: %s", strings.Join(args, " "), err, strings.TrimSpace(out.String()))
	}
	return out.String(), nil
}

// timed runs the docker client and times it, start to end, as a user's
// script would see it.
func (d *dockerDaemon) timed(ctx context.Context, args ...string) (string, time.Duration, error) {
	t0 := time.Now()
	out, err := d.docker(ctx, args...)
	return out, time.Since(t0), err
}

// importTree imports a directory tree as the benchmark's image.
func (d *dockerDaemon) importTree(ctx context.Context, dir, tmp string) error {
	tarPath := filepath.Join(tmp, "busybox.tar")
	if out, err := exec.CommandContext(ctx, "tar", "-C", dir, "-cf", tarPath, ".").CombinedOutput(); err != nil {
		return fmt.Errorf("tar the rootfs: %w: %s", err, out)
	}
	defer os.Remove(tarPath)
	_, err := d.docker(ctx, "import", tarPath, dockerImage)
	return err
}

// Pid is dockerd's process, 0 when unknown.
func (d *dockerDaemon) Pid() int {
	b, err := os.ReadFile(d.pidfile)
	if err != nil {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return pid
}

// Stop stops dockerd (SIGTERM, which stops its containers and its
// containerd), the runner, and removes the cgroup parent. Idempotent.
func (d *dockerDaemon) Stop(ctx context.Context) error {
	var errs []error
	if d.stop != nil {
		d.stop()
		select {
		case err := <-d.done:
			d.done <- err // how it ended does not matter: it was told to
		case <-time.After(90 * time.Second):
			errs = append(errs, errors.New("dockerd did not stop within 90s"))
		}
	}
	if d.runner != nil {
		if err := d.runner.Close(30 * time.Second); err != nil {
			errs = append(errs, fmt.Errorf("docker runner: %w", err))
		}
		d.runner = nil
	}
	if err := harness.RemoveCgroupTree(d.cgroupParent); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// dockerCreator makes idle containers with `docker run -d … sleep`.
type dockerCreator struct{ d *dockerDaemon }

func (c *dockerCreator) system() string { return "docker" }
func (c *dockerCreator) name() string   { return "docker run -d (sleep)" }
func (c *dockerCreator) roots() []int   { return []int{c.d.runner.Pid()} }

func (c *dockerCreator) prepare(ctx context.Context, count int) error { return nil }

func (c *dockerCreator) create(ctx context.Context, i int) error {
	_, err := c.d.docker(ctx, "run", "-d", "--network", "none", "--label", "dsec-bench=1", dockerImage, "sleep", "86400")
	return err
}

// cleanup removes every container of the creator, 50 per call.
func (c *dockerCreator) cleanup(ctx context.Context) error {
	out, err := c.d.docker(ctx, "ps", "-aq", "--filter", "label=dsec-bench=1")
	if err != nil {
		return err
	}
	ids := strings.Fields(out)
	const chunk = 50
	return harness.ForEach(ctx, (len(ids)+chunk-1)/chunk, 4, func(ctx context.Context, i int) error {
		_, err := c.d.docker(ctx, append([]string{"rm", "-f"}, ids[i*chunk:min(len(ids), (i+1)*chunk)]...)...)
		return err
	})
}
