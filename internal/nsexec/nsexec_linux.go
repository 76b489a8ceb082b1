//go:build linux && cgo

package nsexec

// The C part lives in nsexec_linux.c; cgo compiles it into every binary that
// imports this package, and its constructor runs before the Go runtime.

// #cgo CFLAGS: -std=gnu11 -Wall -Wextra -Wno-unused-parameter -O2
import "C"

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"runtime"
	"syscall"
)

// maxStatus bounds what Spawn reads from the helper's status pipe.
const maxStatus = 4096

// Spawn starts cfg's command inside the sandbox whose process is cfg.Pid,
// through a helper: the binary self (normally os.Executable() of a binary
// importing this package) started with ModeEnv=exec. stdio become the
// command's descriptors 0, 1 and 2; nil means /dev/null.
//
// Spawn does not wait for the helper: the caller reaps helperPid, which
// exits as soon as the command runs (or failed to). The command's process,
// childPid (a host pid), is orphaned when the helper exits and is
// reparented to the nearest child subreaper, so the caller must have set
// PR_SET_CHILD_SUBREAPER and must reap helperPid before it can wait for
// childPid. childPid's exit code is the command's; a missing program exits
// 127 and a program that cannot run 126, with a message on its stderr.
//
// A caller that reaps with wait4(-1) may see childPid exit before Spawn
// returns it (a quick command), and must keep such statuses for it.
//
// Spawn blocks until the command's execve has returned, which on a lazily
// fetched layer can take as long as reading the program. A setup failure
// (no such working directory, unmapped user, sandbox gone) returns an error
// of an errdefs kind, usually a *HelperError, with helperPid still set when
// the helper was started.
func Spawn(self string, cfg ExecConfig, stdio [3]*os.File) (helperPid, childPid int, err error) {
	config, err := cfg.Encode()
	if err != nil {
		return 0, 0, err
	}
	return spawnEncoded(self, config, &cfg, stdio)
}

// spawnEncoded is Spawn with the config already encoded; cfg words errors.
func spawnEncoded(self string, config []byte, cfg *ExecConfig, stdio [3]*os.File) (helperPid, childPid int, err error) {
	var files [5]uintptr
	for i, f := range stdio {
		if f == nil {
			null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
			if err != nil {
				return 0, 0, fmt.Errorf("exec: open %s: %w", os.DevNull, err)
			}
			defer null.Close()
			f = null
		}
		files[i] = f.Fd()
		defer runtime.KeepAlive(f)
	}
	configR, configW, err := os.Pipe()
	if err != nil {
		return 0, 0, fmt.Errorf("exec: config pipe: %w", err)
	}
	defer configW.Close()
	statusR, statusW, err := os.Pipe()
	if err != nil {
		configR.Close()
		return 0, 0, fmt.Errorf("exec: status pipe: %w", err)
	}
	defer statusR.Close()
	files[3] = configR.Fd()
	files[4] = statusW.Fd()

	// syscall.ForkExec, not os/exec: the caller reaps every child itself.
	pid, err := syscall.ForkExec(self, []string{"dsec-exec"}, &syscall.ProcAttr{
		Env:   []string{ModeEnv + "=exec"},
		Files: files[:],
	})
	// The helper holds its own copies now (or never will).
	configR.Close()
	statusW.Close()
	if err != nil {
		return 0, 0, fmt.Errorf("exec: start helper %s: %w", self, err)
	}

	// The helper reads the whole config before doing anything, so writing
	// it all before reading the status cannot deadlock. A write error
	// (the helper died) is reported only when the status says nothing.
	_, werr := configW.Write(config)
	if cerr := configW.Close(); werr == nil {
		werr = cerr
	}
	status, rerr := io.ReadAll(io.LimitReader(statusR, maxStatus))
	if rerr != nil {
		return pid, 0, fmt.Errorf("exec: read helper status: %w", rerr)
	}
	if len(status) == 0 && werr != nil {
		return pid, 0, fmt.Errorf("exec: send config to helper: %w", werr)
	}
	childPid, err = parseStatus(status, cfg)
	return pid, childPid, err
}

// parseStatus interprets the helper's status: "ok <pid>\n" or
// "err <errno> <step>: <detail>\n".
func parseStatus(status []byte, cfg *ExecConfig) (int, error) {
	line, ok := bytes.CutSuffix(status, []byte("\n"))
	if !ok {
		return 0, fmt.Errorf("exec: helper ended without a status (got %q)", status)
	}
	if rest, ok := bytes.CutPrefix(line, []byte("ok ")); ok {
		pid, err := atoi(rest)
		if err != nil || pid <= 0 {
			return 0, fmt.Errorf("exec: bad helper status %q", status)
		}
		return pid, nil
	}
	if rest, ok := bytes.CutPrefix(line, []byte("err ")); ok {
		num, msg, ok := bytes.Cut(rest, []byte(" "))
		errno, err := atoi(num)
		if !ok || err != nil || errno < 0 {
			return 0, fmt.Errorf("exec: bad helper status %q", status)
		}
		step, detail, _ := bytes.Cut(msg, []byte(": "))
		return 0, newHelperError(string(step), string(detail), syscall.Errno(errno), cfg)
	}
	return 0, fmt.Errorf("exec: bad helper status %q", status)
}

// atoi parses a non-negative decimal number of at most 9 digits.
func atoi(b []byte) (int, error) {
	if len(b) == 0 || len(b) > 9 {
		return 0, syscall.EINVAL
	}
	n := 0
	for _, c := range b {
		if c < '0' || c > '9' {
			return 0, syscall.EINVAL
		}
		n = n*10 + int(c-'0')
	}
	return n, nil
}
