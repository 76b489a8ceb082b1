package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// session runs one command in a sandbox attached to this process: its
// output to stdout and stderr, this process's input to it (-i), the local
// terminal as its terminal (-t). Signals that would end dsec go to the
// command instead.
type session struct {
	sb  *dsec.Sandbox
	req dsec.ExecRequest
	// stdin, when set, is streamed to the command as it is read, and its
	// end closes the command's input.
	stdin          io.Reader
	stdout, stderr io.Writer
	// tty, when set, is the local terminal: it is put in raw mode for the
	// command's terminal and its size changes are forwarded. stdin must be
	// tty too.
	tty *os.File
	// warn receives dsec's own notes (truncated output, signals).
	warn io.Writer
	// ephemeral: the sandbox is deleted once the session ends, so the
	// command does not run on when dsec stops following it.
	ephemeral bool
}

// terminalOf returns r as a terminal, or nil when it is not one.
func terminalOf(r io.Reader) *os.File {
	if f, ok := r.(*os.File); ok && isTerminal(f.Fd()) {
		return f
	}
	return nil
}

// run starts the command, connects it, waits for it and returns how it
// ended.
func (s *session) run(ctx context.Context) (*dsec.ExitStatus, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	req := s.req
	if s.tty != nil {
		req.TTY, req.Rows, req.Cols = true, 24, 80
		if rows, cols, err := termSize(s.tty.Fd()); err == nil && rows > 0 && cols > 0 {
			req.Rows, req.Cols = rows, cols
		}
	} else if s.stdin != nil {
		req.StdinOpen = true
	}
	// Signals are caught from before the call. Registering them starts a
	// thread, made here while the server starts the command rather than
	// after (about 0.4 ms of a dsec exec's start, bench/cli); one that
	// comes before the command started goes to it once it has.
	sigs := make(chan os.Signal, 2)
	registered := make(chan struct{})
	go func() {
		signal.Notify(sigs, os.Interrupt, syscall.SIGTERM, syscall.SIGHUP)
		close(registered)
	}()
	defer func() {
		<-registered
		signal.Stop(sigs)
	}()

	p, err := s.sb.Start(ctx, req)
	if err != nil {
		return nil, err
	}
	defer p.Close()

	// Helpers that end with the command; wg waits for them.
	done := make(chan struct{})
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel() // a Resize in flight must not hold up the return
	defer close(done)

	if s.tty != nil {
		restore, err := makeRaw(s.tty.Fd())
		if err != nil {
			_ = p.Signal(context.WithoutCancel(ctx), 1) // SIGHUP: nobody is at its terminal
			return nil, fmt.Errorf("put the terminal in raw mode: %w", err)
		}
		// Restored before anything else runs on return: deferred after
		// close(done), so it runs first.
		defer restore()
		winch := make(chan os.Signal, 1)
		stopWinch := notifyResize(winch)
		wg.Go(func() {
			defer stopWinch()
			for {
				select {
				case <-done:
					return
				case <-winch:
					if rows, cols, err := termSize(s.tty.Fd()); err == nil && rows > 0 && cols > 0 {
						_ = p.Resize(ctx, rows, cols)
					}
				}
			}
		})
	}

	if s.stdin != nil {
		// Not waited for: a read of a terminal or pipe cannot be
		// interrupted. It ends at the input's end, or at its next read
		// once the command has ended (its write then fails), or with dsec.
		go func() {
			if _, err := io.Copy(p.Stdin, s.stdin); err != nil {
				return // the command ended, or its input could not be written
			}
			_ = p.Stdin.Close()
		}()
	}

	var stopped atomic.Bool // by a second signal
	wg.Go(func() {
		forwarded := false
		for {
			select {
			case <-done:
				return
			case sig := <-sigs:
				if forwarded {
					// Asked twice: stop following; the command runs on.
					stopped.Store(true)
					cancel()
					return
				}
				forwarded = true
				n := linuxNumber(sig)
				s.note("sending SIG%s to exec %s (again to stop following it)", signalName(n), p.ID)
				if err := p.Signal(ctx, n); err != nil {
					s.note("signal exec %s: %v", p.ID, err)
				}
			}
		}
	})

	st, err := p.Wait(s.stdout, s.stderr)
	if err != nil && stopped.Load() {
		if s.ephemeral {
			s.note("stopped following exec %s", p.ID)
		} else {
			s.note("stopped following exec %s; it runs on (dsec attach %s %s follows it again)", p.ID, s.sb.ID, p.ID)
		}
		return st, errStopped
	}
	if err == nil {
		if st.StdoutTruncated {
			s.note("exec %s: its output passed the cap; the rest was dropped", st.ExecID)
		}
		if st.StderrTruncated {
			s.note("exec %s: its stderr passed the cap; the rest was dropped", st.ExecID)
		}
	}
	return st, err
}

// note writes one of dsec's own lines (with a carriage return while the
// terminal is raw).
func (s *session) note(format string, args ...any) {
	eol := "\n"
	if s.tty != nil {
		eol = "\r\n"
	}
	fmt.Fprintf(s.warn, "dsec: "+format+eol, args...)
}

// linuxNumber is the Linux number of a signal dsec received.
func linuxNumber(sig os.Signal) int {
	switch sig {
	case os.Interrupt:
		return 2
	case syscall.SIGHUP:
		return 1
	}
	return 15
}

// errStopped: the user asked to stop following a command.
var errStopped = errors.New("stopped following the command")

// exitOf turns how a command ended into dsec's exit: its code (128+N for
// signal N, 124 for a timeout), or an error for a command whose end was
// lost or that could not be followed to its end; 130 when the user stopped
// following it.
func exitOf(sandboxID string, st *dsec.ExitStatus, err error) error {
	if errors.Is(err, errStopped) {
		return exitError{130}
	}
	if err != nil {
		if st != nil && st.ExecID != "" && !errors.Is(err, context.Canceled) {
			return fmt.Errorf("%w\n(follow it with: dsec attach %s %s)", err, sandboxID, st.ExecID)
		}
		return err
	}
	if st.Lost {
		return fmt.Errorf("exec %s in sandbox %s: its end was lost (the node's keeper restarted while it ran): it may have ended any way, and its output so far is kept (dsec execs %s)", st.ExecID, sandboxID, sandboxID)
	}
	if code := st.Code(); code != 0 {
		return exitError{code}
	}
	return nil
}
