package pageout

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Process is a process whose memory is advised, named by a pidfd.
type Process struct {
	pid int
	fd  int
}

// Open names process pid by a pidfd. It fails with NotFound when the
// process is gone.
func Open(pid int) (*Process, error) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		if errors.Is(err, unix.ESRCH) {
			return nil, errdefs.Newf(errdefs.ErrNotFound, "process %d is gone", pid)
		}
		return nil, fmt.Errorf("open process %d: %w", pid, err)
	}
	return &Process{pid: pid, fd: fd}, nil
}

// Close releases the pidfd.
func (p *Process) Close() error { return unix.Close(p.fd) }

// Pid is the process's pid.
func (p *Process) Pid() int { return p.pid }

// alive fails with NotFound once the process has ended, so that a pid
// reused since Open is never read.
func (p *Process) alive() error {
	if err := unix.PidfdSendSignal(p.fd, 0, nil, 0); err != nil {
		return errdefs.Newf(errdefs.ErrNotFound, "process %d is gone", p.pid)
	}
	return nil
}

// Mappings returns the process's mappings that can hold pages: not the
// kernel's special ones ([vsyscall], [vvar], [vdso]) and not those
// without any access (reserved address space, guard pages), which
// hold none it could touch.
func (p *Process) Mappings() ([]Range, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(p.pid) + "/maps")
	if err != nil {
		return nil, fmt.Errorf("read mappings of process %d: %w", p.pid, err)
	}
	if err := p.alive(); err != nil {
		return nil, err
	}
	return parseMaps(b)
}

// parseMaps reads /proc/PID/maps.
func parseMaps(b []byte) ([]Range, error) {
	var out []Range
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) < 5 {
			continue
		}
		lo, hi, ok := strings.Cut(f[0], "-")
		if !ok {
			return nil, fmt.Errorf("maps line %q: no address range", sc.Text())
		}
		s, err1 := strconv.ParseUint(lo, 16, 64)
		e, err2 := strconv.ParseUint(hi, 16, 64)
		if err1 != nil || err2 != nil || e <= s {
			return nil, fmt.Errorf("maps line %q: bad address range", sc.Text())
		}
		if strings.HasPrefix(f[1], "---") {
			continue
		}
		if len(f) >= 6 && (f[5] == "[vsyscall]" || f[5] == "[vvar]" || f[5] == "[vdso]" || f[5] == "[vvar_vclock]") {
			continue
		}
		out = append(out, Range{s, e})
	}
	return out, sc.Err()
}

// pagemapPresent is bit 63 of a pagemap entry: the page is in RAM.
const pagemapPresent = 1 << 63

// Resident returns the ranges of the process's mappings whose pages are
// in RAM (/proc/PID/pagemap), sorted, with gaps of up to 64 KiB merged.
func (p *Process) Resident() ([]Range, error) {
	maps, err := p.Mappings()
	if err != nil {
		return nil, err
	}
	f, err := os.Open("/proc/" + strconv.Itoa(p.pid) + "/pagemap")
	if err != nil {
		return nil, fmt.Errorf("read the pages of process %d: %w", p.pid, err)
	}
	defer f.Close()
	if err := p.alive(); err != nil {
		return nil, err
	}
	page := uint64(os.Getpagesize())
	const batch = 8192 // pages read at once
	buf := make([]byte, 8*batch)
	var out []Range
	for _, m := range maps {
		for a := m.Start; a < m.End; {
			n := min((m.End-a)/page, batch)
			b := buf[:8*n]
			got, err := f.ReadAt(b, int64(a/page*8))
			if err != nil && !errors.Is(err, io.EOF) {
				return nil, fmt.Errorf("read the pages of process %d: %w", p.pid, err)
			}
			for i := 0; i+8 <= got; i += 8 {
				if binary.NativeEndian.Uint64(b[i:])&pagemapPresent == 0 {
					continue
				}
				pa := a + uint64(i/8)*page
				if k := len(out); k > 0 && out[k-1].End == pa {
					out[k-1].End += page
				} else {
					out = append(out, Range{pa, pa + page})
				}
			}
			if got < len(b) {
				break
			}
			a += n * page
		}
	}
	return coalesce(out, mergeGap), nil
}

// Advise gives advice on ranges of the process's memory, in calls of at
// most ChunkBytes, and returns how many bytes the kernel took. A range the
// kernel refuses (a locked mapping for PageOut, one unmapped since) is
// skipped. It stops with ctx's error between calls, and with NotFound once
// the process has ended.
func (p *Process) Advise(ctx context.Context, ranges []Range, a Advice) (uint64, error) {
	var advice int
	switch a {
	case PageOut:
		advice = unix.MADV_PAGEOUT
	case WillNeed:
		advice = unix.MADV_WILLNEED
	default:
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "advice %d is unknown", a)
	}
	var done uint64
	for _, c := range chunks(ranges) {
		for len(c) > 0 {
			if err := ctx.Err(); err != nil {
				return done, err
			}
			n, err := processMadvise(p.fd, c, advice)
			done += uint64(max(n, 0))
			switch {
			case err == nil && uint64(n) == Total(c):
				c = nil
				continue
			case errors.Is(err, unix.ESRCH):
				return done, errdefs.Newf(errdefs.ErrNotFound, "process %d is gone", p.pid)
			case err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOMEM) && !errors.Is(err, unix.EAGAIN):
				return done, fmt.Errorf("advise process %d (%v): %w", p.pid, a, err)
			}
			// The kernel stopped at a range it refused: skip it.
			c = skipRefused(c, uint64(max(n, 0)))
		}
	}
	return done, nil
}

// skipRefused drops from c the bytes the kernel took (n) and the range it
// stopped at.
func skipRefused(c []Range, n uint64) []Range {
	for len(c) > 0 && n >= c[0].Len() {
		n -= c[0].Len()
		c = c[1:]
	}
	if len(c) > 0 {
		c = c[1:]
	}
	return c
}
