// Package debian builds root file systems from Debian packages with
// mmdebstrap, from the machine's own apt sources: no mirror is named, so
// a build reaches exactly the repositories (and proxies, and pins) the
// machine's apt is configured for.
//
// A build writes a tar stream of the root file system, which the caller
// turns into an EROFS layer (internal/layer). It runs mmdebstrap in root
// mode when run as root, and in its unshare mode otherwise (which needs
// subordinate uids for the user in /etc/subuid).
package debian

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// Options describe a root file system. Only Packages is required.
type Options struct {
	// Packages are installed on top of the variant's, with their
	// dependencies (not their recommendations).
	Packages []string
	// Suite is the Debian release (default: the machine's, from
	// /etc/os-release).
	Suite string
	// Variant is mmdebstrap's package set to start from (default
	// "essential": only Essential:yes packages, no apt).
	Variant string
	// Sources are apt source files (one-line .list or deb822 .sources);
	// default: the machine's, as apt itself reads them (HostSources).
	Sources []string
	// Customize are shell commands run with /bin/sh -c inside the new
	// root (chroot) after the packages are installed, in order, with Env
	// added to their environment; for example to warm a compiler's cache.
	Customize []string
	Env       []string
	// KeepDocs keeps /usr/share/doc, man and info pages and translations,
	// which are left out by default (copyright files are always kept).
	KeepDocs bool
	// Log receives mmdebstrap's progress lines and the output of the
	// Customize commands (default: discarded).
	Log io.Writer
}

// Build runs mmdebstrap and writes the root file system to out as a tar
// stream. Its errors say what to install or fix.
func Build(ctx context.Context, opts Options, out io.Writer) error {
	args, env, err := command(opts)
	if err != nil {
		return err
	}
	bin, err := exec.LookPath("mmdebstrap")
	if err != nil {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"mmdebstrap is not installed: install it (apt-get install mmdebstrap) to build images from Debian packages")
	}
	log := opts.Log
	if log == nil {
		log = io.Discard
	}
	tail := &tailWriter{w: log}
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(append(os.Environ(), env...), "PATH="+systemPath(os.Getenv("PATH")))
	cmd.Stdout = out
	cmd.Stderr = tail
	// mmdebstrap removes its temporary root (and what it mounted there)
	// when told to stop; a SIGKILL would leave them.
	cmd.Cancel = func() error { return cmd.Process.Signal(syscall.SIGTERM) }
	cmd.WaitDelay = 30 * time.Second
	err = cmd.Run()
	if ctx.Err() != nil {
		return ctx.Err()
	}
	if err != nil {
		msg := fmt.Sprintf("mmdebstrap %s failed (%v)", strings.Join(opts.Packages, ","), err)
		if last := tail.last(); last != "" {
			msg += ":\n" + last
		}
		if os.Geteuid() != 0 {
			msg += "\n(not running as root: mmdebstrap then needs unprivileged user namespaces and a range for this user in /etc/subuid and /etc/subgid; or run the build as root)"
		}
		return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s", msg)
	}
	return nil
}

// command returns mmdebstrap's arguments and the environment to add.
func command(opts Options) (args, env []string, err error) {
	if len(opts.Packages) == 0 {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "no Debian packages given (example: python3,bash)")
	}
	for _, p := range opts.Packages {
		if !packageRE.MatchString(p) {
			return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument,
				"%q is not a Debian package name: lowercase letters, digits, '+', '-' and '.', optionally =VERSION", p)
		}
	}
	suite := opts.Suite
	if suite == "" {
		if suite, err = HostSuite(); err != nil {
			return nil, nil, err
		}
	}
	if !suiteRE.MatchString(suite) {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%q is not a Debian suite name (example: bookworm)", suite)
	}
	variant := opts.Variant
	if variant == "" {
		variant = "essential"
	}
	if !suiteRE.MatchString(variant) {
		return nil, nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%q is not an mmdebstrap variant (essential, apt, minbase, required, important, standard)", variant)
	}
	sources := opts.Sources
	if sources == nil {
		if sources, err = HostSources(); err != nil {
			return nil, nil, err
		}
	}
	if len(sources) == 0 {
		return nil, nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"this machine has no apt sources (/etc/apt/sources.list, /etc/apt/sources.list.d/*.list or *.sources): configure apt first")
	}
	args = []string{"--variant=" + variant, "--format=tar", "--include=" + strings.Join(opts.Packages, ",")}
	if !opts.KeepDocs {
		for _, p := range []string{"/usr/share/doc/*", "/usr/share/man/*", "/usr/share/info/*", "/usr/share/locale/*", "/usr/share/lintian/*"} {
			args = append(args, "--dpkgopt=path-exclude="+p)
		}
		args = append(args, "--dpkgopt=path-include=/usr/share/doc/*/copyright")
	}
	if len(opts.Customize) > 0 {
		for i, c := range opts.Customize {
			// The command travels in the environment, so nothing in it
			// needs quoting for mmdebstrap's shell.
			name := "DSEC_BUILD_RUN_" + strconv.Itoa(i)
			env = append(env, name+"="+c)
			args = append(args, `--customize-hook=env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin HOME=/root `+envArgs(opts.Env)+` chroot "$1" /bin/sh -ec "$`+name+`"`)
		}
	}
	args = append(args, suite, "-")
	args = append(args, sources...)
	return args, env, nil
}

// systemPath puts the system's directories first in PATH: mmdebstrap's
// helpers (mmtarfilter, run once per package when documentation is left
// out) are Debian's Python scripts, which must not start through a
// user's python3 shims (pyenv's made a 10 s build take minutes).
func systemPath(path string) string {
	return "/usr/sbin:/usr/bin:/sbin:/bin:" + path
}

// envArgs quotes K=V pairs for a shell command line.
func envArgs(env []string) string {
	var b strings.Builder
	for _, kv := range env {
		b.WriteString("'" + strings.ReplaceAll(kv, "'", `'\''`) + "' ")
	}
	return b.String()
}

var (
	// Debian policy 5.6.1: at least two characters, lowercase letters,
	// digits, '+', '-' and '.', starting with a letter or digit; then an
	// optional =version (policy 5.6.12).
	packageRE = lazyregexp.New(`^[a-z0-9][a-z0-9+.-]+(=[A-Za-z0-9.+~:-]+)?$`)
	suiteRE   = lazyregexp.New(`^[a-z0-9][a-z0-9.-]*$`)
)

// ParsePackages splits a comma-separated list of package names and checks
// each.
func ParsePackages(list string) ([]string, error) {
	var out []string
	for _, p := range strings.Split(list, ",") {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !packageRE.MatchString(p) {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
				"%q is not a Debian package name: lowercase letters, digits, '+', '-' and '.', optionally =VERSION", p)
		}
		out = append(out, p)
	}
	if len(out) == 0 {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "no Debian packages given (example: python3,bash)")
	}
	return out, nil
}

// HostSources returns the apt source files apt reads on this machine:
// /etc/apt/sources.list when it has an entry, then sources.list.d's *.list
// and *.sources files in name order.
func HostSources() ([]string, error) {
	return sourcesIn("/etc/apt")
}

func sourcesIn(dir string) ([]string, error) {
	var out []string
	main := filepath.Join(dir, "sources.list")
	if b, err := os.ReadFile(main); err == nil && hasEntry(b) {
		out = append(out, main)
	}
	ents, err := os.ReadDir(filepath.Join(dir, "sources.list.d"))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read apt sources: %w", err)
	}
	var names []string
	for _, e := range ents {
		n := e.Name()
		if !e.Type().IsRegular() && e.Type()&os.ModeSymlink == 0 {
			continue
		}
		if strings.HasSuffix(n, ".list") || strings.HasSuffix(n, ".sources") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		p := filepath.Join(dir, "sources.list.d", n)
		if b, err := os.ReadFile(p); err == nil && hasEntry(b) {
			out = append(out, p)
		}
	}
	return out, nil
}

// hasEntry reports whether an apt source file has a line that is neither
// empty nor a comment.
func hasEntry(b []byte) bool {
	for _, line := range bytes.Split(b, []byte("\n")) {
		line = bytes.TrimSpace(line)
		if len(line) > 0 && line[0] != '#' {
			return true
		}
	}
	return false
}

// HostSuite returns the machine's Debian release code name.
func HostSuite() (string, error) {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "", errdefs.Newf(errdefs.ErrFailedPrecondition, "cannot tell this machine's Debian release (%v): name the suite (example: bookworm)", err)
	}
	if s := osReleaseField(b, "VERSION_CODENAME"); s != "" {
		return s, nil
	}
	return "", errdefs.Newf(errdefs.ErrFailedPrecondition, "/etc/os-release names no VERSION_CODENAME: name the suite (example: bookworm)")
}

func osReleaseField(b []byte, key string) string {
	sc := bufio.NewScanner(bytes.NewReader(b))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), "=")
		if ok && strings.TrimSpace(k) == key {
			return strings.Trim(strings.TrimSpace(v), `"'`)
		}
	}
	return ""
}

// tailWriter passes lines on to w and keeps the last few for an error
// message.
type tailWriter struct {
	w     io.Writer
	lines []string
	part  []byte
}

const tailLines = 15

func (t *tailWriter) Write(p []byte) (int, error) {
	_, _ = t.w.Write(p)
	t.part = append(t.part, p...)
	for {
		i := bytes.IndexByte(t.part, '\n')
		if i < 0 {
			break
		}
		t.lines = append(t.lines, string(t.part[:i]))
		if len(t.lines) > tailLines {
			t.lines = t.lines[len(t.lines)-tailLines:]
		}
		t.part = t.part[i+1:]
	}
	if len(t.part) > 4096 {
		t.part = t.part[:0]
	}
	return len(p), nil
}

func (t *tailWriter) last() string {
	lines := t.lines
	if len(t.part) > 0 {
		lines = append(lines, string(t.part))
	}
	return strings.Join(lines, "\n")
}
