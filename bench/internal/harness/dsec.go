//go:build linux

package harness

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// DsecConfig says how to start a private dsec.
type DsecConfig struct {
	// Bin is the static dsec binary.
	Bin string
	// StateDir is the state directory (created; the caller removes it).
	StateDir string
	// CgroupParent holds every sandbox's cgroup; Stop removes it.
	CgroupParent string
	// Node names the node (default "bench").
	Node string
	// Args are more flags of `dsec up` ("--runtime", "crun").
	Args []string
}

// Dsec is a `dsec up` of the benchmark's own, on a free loopback port.
type Dsec struct {
	Addr   string // host:port of the API
	Client *dsec.Client
	cfg    DsecConfig
	cmd    *exec.Cmd
	exited chan error // receives the up's end once
	logf   *os.File
}

// StartDsec starts `dsec up` and returns once its API answers.
func StartDsec(ctx context.Context, cfg DsecConfig) (d *Dsec, err error) {
	if cfg.Node == "" {
		cfg.Node = "bench"
	}
	if err := os.MkdirAll(cfg.StateDir, 0o700); err != nil {
		return nil, fmt.Errorf("dsec state dir: %w", err)
	}
	addr, err := freePort()
	if err != nil {
		return nil, err
	}
	logf, err := os.Create(filepath.Join(cfg.StateDir, "up.log"))
	if err != nil {
		return nil, fmt.Errorf("dsec log: %w", err)
	}
	// The compatibility and ports listeners are off (cfg.Args may turn
	// them on): their default addresses belong to the user's own dsec up,
	// which may be running.
	args := append([]string{"up", "--state-dir", cfg.StateDir, "--listen", addr,
		"--cgroup-parent", cfg.CgroupParent, "--node", cfg.Node, "--log-level", "warn", "--sandboxfusion-listen=", "--ports-listen="}, cfg.Args...)
	cmd := exec.Command(cfg.Bin, args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		logf.Close()
		return nil, fmt.Errorf("start dsec up: %w", err)
	}
	d = &Dsec{Addr: addr, cfg: cfg, cmd: cmd, exited: make(chan error, 1), logf: logf}
	go func() { d.exited <- cmd.Wait() }()
	defer func() {
		if err != nil {
			_ = d.Stop(context.WithoutCancel(ctx))
		}
	}()
	if err := d.waitReady(ctx); err != nil {
		return d, err
	}
	key, err := os.ReadFile(filepath.Join(cfg.StateDir, "admin.key"))
	if err != nil {
		return d, fmt.Errorf("dsec admin key: %w", err)
	}
	d.Client, err = dsec.New(dsec.Config{Addr: "http://" + addr, APIKey: strings.TrimSpace(string(key))})
	if err != nil {
		return d, fmt.Errorf("dsec client: %w", err)
	}
	return d, nil
}

func freePort() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", fmt.Errorf("free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func (d *Dsec) waitReady(ctx context.Context) error {
	err := WaitHTTPOK(ctx, &http.Client{Timeout: time.Second}, "http://"+d.Addr+"/healthz", 90*time.Second, d.exited)
	if err != nil {
		return fmt.Errorf("dsec up not ready: %w:\n%s", err, d.LogTail(30))
	}
	return nil
}

// WaitHTTPOK polls url with client until it answers 200, the process
// whose end exited reports ends (its error is put back for others to
// read), limit passes or ctx ends.
func WaitHTTPOK(ctx context.Context, client *http.Client, url string, limit time.Duration, exited chan error) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("it exited at start (%v)", err)
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// StateDir is the up's state directory.
func (d *Dsec) StateDir() string { return d.cfg.StateDir }

// CgroupParent is the cgroup that holds the sandboxes.
func (d *Dsec) CgroupParent() string { return d.cfg.CgroupParent }

// UpPid is the `dsec up` process.
func (d *Dsec) UpPid() int { return d.cmd.Process.Pid }

// KeeperPid asks the node keeper for its process.
func (d *Dsec) KeeperPid(ctx context.Context) (int, error) {
	kc := keeper.NewClient(d.cfg.StateDir)
	defer kc.Close()
	v, err := kc.Version(ctx)
	if err != nil {
		return 0, fmt.Errorf("keeper version: %w", err)
	}
	return v.Pid, nil
}

// CLI runs the dsec CLI against this up and returns its combined output.
func (d *Dsec) CLI(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, d.cfg.Bin, args...)
	cmd.Env = append(os.Environ(), "DSEC_ADDR=http://"+d.Addr, "DSEC_STATE_DIR="+d.cfg.StateDir,
		"DSEC_API_KEY=", "HOME="+d.cfg.StateDir)
	out, err := cmd.CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("dsec %s: %w: %s", strings.Join(args, " "), err, out)
	}
	return string(out), nil
}

// BuildImage builds the image name from a directory tree.
func (d *Dsec) BuildImage(ctx context.Context, name, dir string) error {
	_, err := d.CLI(ctx, "image", "build", name, "--from-dir", dir)
	return err
}

// LogTail returns the last n lines of the up's and the keeper's logs.
func (d *Dsec) LogTail(n int) string {
	return "--- dsec up ---\n" + tail(filepath.Join(d.cfg.StateDir, "up.log"), n) +
		"\n--- keeper ---\n" + tail(filepath.Join(d.cfg.StateDir, "logs", "keeper.log"), n)
}

func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	return strings.Join(lines[max(0, len(lines)-n):], "\n")
}

// Stop stops the up (SIGTERM), then the keeper with every sandbox, and
// removes the cgroup parent. It is idempotent.
func (d *Dsec) Stop(ctx context.Context) error {
	var errs []error
	if d.Client != nil {
		d.Client.Close()
	}
	if d.cmd != nil {
		_ = d.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-d.exited:
			d.exited <- err
		case <-time.After(30 * time.Second):
			_ = d.cmd.Process.Kill()
			err := <-d.exited
			d.exited <- err
			errs = append(errs, errors.New("dsec up did not stop within 30s of SIGTERM: killed"))
		}
	}
	kctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	kc := keeper.NewClient(d.cfg.StateDir)
	defer kc.Close()
	if v, err := kc.Version(kctx); err == nil {
		if err := kc.Shutdown(kctx, true); err != nil {
			errs = append(errs, fmt.Errorf("keeper shutdown: %w", err))
		}
		for kctx.Err() == nil {
			if err := syscall.Kill(v.Pid, 0); errors.Is(err, syscall.ESRCH) {
				break
			}
			if p, err := ReadProc(v.Pid); err == nil && p.State == "Z" {
				break // ended; its parent has not reaped it yet
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if err := RemoveCgroupTree(d.cfg.CgroupParent); err != nil {
		errs = append(errs, err)
	}
	if d.logf != nil {
		d.logf.Close()
	}
	return errors.Join(errs...)
}
