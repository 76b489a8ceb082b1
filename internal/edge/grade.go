package edge

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// GradeParams is a GradeFrom request: the sandbox graded, the paths copied
// from it, the image of the grading sandbox (empty: the graded sandbox's
// layers) and the command run there.
type GradeParams struct {
	Sandbox      string
	Paths        []string
	Image        string
	Argv         []string
	Shell        string
	Env          map[string]string
	Cwd          string
	User         string
	Timeout      time.Duration
	OutputLimit  int64
	Resources    sandbox.Resources
	MaxCopyBytes int64
}

// GradeResult is what a grade returns.
type GradeResult struct {
	Exit           sandbox.ExitStatus
	Stdout, Stderr []byte
	Grader         string
	CopiedFiles    int64
	CopiedBytes    int64
}

const (
	// maxGradePaths is the most paths one grade copies.
	maxGradePaths = 256
	// defaultGradeCopyBytes bounds the file data a grade copies when the
	// request gives no bound.
	defaultGradeCopyBytes = 1 << 30
	// maxGradeEntries bounds the files, directories and links a grade
	// copies (the tar extractor's own default bound).
	maxGradeEntries = 100_000
	// defaultGradeTimeout is the grading command's timeout when none is
	// given.
	defaultGradeTimeout = 10 * time.Minute
	// maxGradeTimeout bounds the grading command's timeout.
	maxGradeTimeout = 24 * time.Hour
	// defaultGradeOutput caps each output stream when no limit is given
	// (the exec default of CONTRACT.md).
	defaultGradeOutput = 16 << 20
	// graderLabel marks a grading sandbox with the sandbox it grades.
	graderLabel = "dsec.io/grader-of"
)

// linkUploader is the optional capability of a backend to extract an
// archive keeping its symbolic links whatever their targets (never
// following them); without it a link that leads out of the copied tree is
// refused by the backend's UploadTar.
type linkUploader interface {
	UploadTarLinks(ctx context.Context, id, dir string, r io.Reader, opts sandbox.TarOptions) (sandbox.TarStats, error)
}

// tarStatser is the optional capability of a backend to report what its
// archive of a path left out (devices, sockets, files on kernel file
// systems), so that a grade can refuse them instead of copying less than
// it was asked to; it also bounds the file data at the source.
type tarStatser interface {
	DownloadTarStats(ctx context.Context, id, path string, w io.Writer, maxBytes int64) (sandbox.TarStats, error)
}

// GradeFrom makes a fresh sandbox from sandbox p.Sandbox's original layers
// (or p.Image), copies p.Paths into it from that sandbox, runs the command
// there and deletes it, on every path out of the call. The graded sandbox
// is neither changed nor frozen (docs/grading.md says why); a paused one
// is resumed first.
func (e *Edge) GradeFrom(ctx context.Context, caller Caller, p GradeParams) (*GradeResult, error) {
	paths, err := gradePaths(p.Paths)
	if err != nil {
		return nil, err
	}
	switch {
	case len(p.Argv) > 0 && p.Shell != "":
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade takes argv or a shell command, not both")
	case len(p.Argv) == 0 && p.Shell == "":
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: no command: give argv or a shell command")
	case p.Timeout < 0 || p.OutputLimit < 0 || p.MaxCopyBytes < 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: timeout, output limit and copy limit must not be negative")
	case p.Timeout > maxGradeTimeout:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: timeout %s is above the most a grade may run, %s", p.Timeout, maxGradeTimeout)
	}
	if err := validateEnv(p.Env); err != nil {
		return nil, err
	}
	if p.Timeout == 0 {
		p.Timeout = defaultGradeTimeout
	}
	if p.OutputLimit == 0 {
		p.OutputLimit = defaultGradeOutput
	}
	if p.MaxCopyBytes == 0 {
		p.MaxCopyBytes = defaultGradeCopyBytes
	}
	// A paused sandbox is resumed to be graded, and no pause stops it
	// until its files are copied.
	r, copied, err := e.ready(ctx, caller, p.Sandbox)
	if err != nil {
		return nil, err
	}
	defer copied()
	if !r.active() {
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): only a running sandbox can be graded", r.ID, r.State, r.Reason)
	}
	src, err := e.backend(r.Backend)
	if err != nil {
		return nil, err
	}
	e.touch(r.ID)

	cp := CreateParams{
		Image:     p.Image,
		Labels:    map[string]string{graderLabel: r.ID},
		Resources: r.Resources,
		Env:       r.Env,
		Backend:   r.Backend,
		grader:    true,
		// After a crash of the node the record lasts until these end (a
		// restart of the edge deletes it: reconcile.go).
		TTL:     p.Timeout + 10*time.Minute,
		IdleTTL: p.Timeout + 10*time.Minute,
	}
	// Each resource the request leaves out is the graded sandbox's.
	if q := p.Resources; q.MemoryBytes != 0 {
		cp.Resources.MemoryBytes = q.MemoryBytes
	}
	if q := p.Resources; q.CPUs != 0 {
		cp.Resources.CPUs = q.CPUs
	}
	if q := p.Resources; q.Pids != 0 {
		cp.Resources.Pids = q.Pids
	}
	if q := p.Resources; q.DiskBytes != 0 {
		cp.Resources.DiskBytes = q.DiskBytes
	}
	if p.Image == "" {
		// The image as the sandbox was made from it: its layers, not
		// what its name points to now, nor its writable layer.
		cp.Workdir, cp.User = r.Workdir, r.User
		cp.resolved = &Image{Name: r.Image, Layers: r.Layers, Env: r.ImageEnv, Workdir: r.Workdir, User: r.User}
	}
	// The grading sandbox belongs to the graded sandbox's project (an
	// administrator's grade does not land in the administrator's).
	gc := caller
	gc.Project = r.Project
	g, err := e.create(ctx, gc, cp)
	if err != nil {
		return nil, fmt.Errorf("grade %s: create the grading sandbox: %w", r.ID, err)
	}
	defer func() {
		// On every path out: success, failure, the caller gone, a timeout.
		dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
		defer cancel()
		if derr := e.deleteOne(dctx, g.ID, EventDeleted, ""); derr != nil {
			e.log.Warn("delete grading sandbox", "sandbox", g.ID, "graded", r.ID, "err", derr)
		}
	}()
	dst, err := e.backend(g.Backend)
	if err != nil {
		return nil, err
	}
	res := &GradeResult{Grader: g.ID}
	budget := gradeBudget{bytes: p.MaxCopyBytes, entries: maxGradeEntries}
	for _, pth := range paths {
		st, err := copyPath(ctx, src, r.ID, dst, g.ID, pth, &budget)
		res.CopiedFiles += st.Files + st.Links
		res.CopiedBytes += st.Bytes
		if err != nil {
			return nil, fmt.Errorf("grade %s: copy %s: %w", r.ID, pth, err)
		}
	}
	copied()

	var out [2]bytes.Buffer
	var exit *sandbox.ExitStatus
	err = e.Exec(ctx, gc, ExecParams{
		Sandbox: g.ID, Argv: p.Argv, Shell: p.Shell, Env: p.Env, Cwd: p.Cwd, User: p.User,
		Timeout: p.Timeout, OutputLimit: p.OutputLimit,
	}, func(ev ExecEvent) error {
		switch {
		case ev.Output != nil:
			if i := int(ev.Output.Stream) - 1; i == 0 || i == 1 {
				// The exec caps each stream at OutputLimit; this keeps a
				// reply bounded whatever the backend sends.
				if room := p.OutputLimit - int64(out[i].Len()); room > 0 {
					out[i].Write(ev.Output.Data[:min(int64(len(ev.Output.Data)), room)])
				}
			}
		case ev.Exit != nil:
			exit = ev.Exit
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("grade %s: run the command in grading sandbox %s: %w", r.ID, g.ID, err)
	}
	if exit == nil {
		return nil, fmt.Errorf("grade %s: the command in grading sandbox %s ended without an exit status", r.ID, g.ID)
	}
	res.Exit, res.Stdout, res.Stderr = *exit, out[0].Bytes(), out[1].Bytes()
	return res, nil
}

// gradePaths checks the paths a grade copies: absolute, clean, without
// NUL, not the root nor a kernel file system, none under another, at most
// maxGradePaths.
func gradePaths(paths []string) ([]string, error) {
	switch {
	case len(paths) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: no paths to copy: name the files or directories the work is in")
	case len(paths) > maxGradePaths:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: %d paths to copy: at most %d (copy their parent directories instead)", len(paths), maxGradePaths)
	}
	seen := map[string]bool{}
	var out []string
	for _, p := range paths {
		switch {
		case strings.IndexByte(p, 0) >= 0:
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: path %.200q holds a NUL byte", p)
		case !path.IsAbs(p):
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: path %.200q is not absolute: give it from / (for example /workspace/repo)", p)
		case path.Clean(p) != p:
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: path %.200q is not clean: give it as %.200q", p, path.Clean(p))
		case p == "/":
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: / cannot be copied: name the directories the work is in")
		case len(p) > 4096:
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: path %.80q… is longer than 4096 bytes", p)
		}
		for _, k := range []string{"/proc", "/sys", "/dev"} {
			if p == k || strings.HasPrefix(p, k+"/") {
				return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: %.200q is under %s, which is the kernel's, not the sandbox's work: copy files the work is in", p, k)
			}
		}
		if !seen[p] {
			seen[p] = true
			out = append(out, p)
		}
	}
	// One path under another would be extracted through what the first
	// made: a link there would lead the second anywhere in the grader.
	for i, a := range out {
		for _, b := range out[i+1:] {
			if strings.HasPrefix(b, a+"/") || strings.HasPrefix(a, b+"/") {
				return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "grade: paths %.200q and %.200q overlap: name only the outer one", a, b)
			}
		}
	}
	return out, nil
}

// gradeBudget is what is left of a grade's copy bounds.
type gradeBudget struct {
	bytes   int64
	entries int64
}

// copyPath copies the tree at p in sandbox srcID to the same path in
// sandbox dstID: the source's archive of it (which never follows a link
// at or under p), checked entry by entry on its way, extracted in the
// destination (which spools and checks an archive whole before writing
// anything, and replaces links rather than following them).
func copyPath(ctx context.Context, src sandbox.Backend, srcID string, dst sandbox.Backend, dstID, p string, b *gradeBudget) (sandbox.TarStats, error) {
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	maxBytes := max(b.bytes, 1) // 0 would be no bound; the check refuses what is past it
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		var err error
		if ts, ok := src.(tarStatser); ok {
			var st sandbox.TarStats
			st, err = ts.DownloadTarStats(cctx, srcID, p, pw, maxBytes)
			if err == nil && st.Skipped > 0 {
				err = errdefs.Newf(errdefs.ErrFailedPrecondition,
					"%d of the entries under %s cannot be copied (device nodes, sockets, files on kernel file systems or held by a lease, paths too long): a grade copies only regular files, directories and symbolic links; remove them or name the paths around them", st.Skipped, p)
			}
		} else {
			err = src.DownloadTar(cctx, srcID, p, pw)
		}
		if errdefs.Is(err, errdefs.ErrResourceExhausted) {
			err = copyLimitError(p, maxBytes)
		}
		pw.CloseWithError(err)
		done <- err
	}()
	chk := &tarCheck{root: p, budget: b}
	rd, wr := io.Pipe()
	checked := make(chan error, 1)
	go func() {
		err := chk.copy(wr, pr)
		pr.CloseWithError(err) // stops the source if the check refused
		wr.CloseWithError(err)
		checked <- err
	}()
	upload := dst.UploadTar
	if lu, ok := dst.(linkUploader); ok {
		upload = lu.UploadTarLinks
	}
	st, err := upload(cctx, dstID, path.Dir(p), rd, sandbox.TarOptions{MakeParents: true})
	rd.CloseWithError(io.ErrClosedPipe)
	cancel()
	errs := []error{<-done, <-checked, err}
	// The first cause wins: the source's refusal or the check's, not the
	// complaints of the others about a stream cut short.
	for _, e := range errs {
		if e != nil && !errors.Is(e, io.ErrClosedPipe) && !errors.Is(e, context.Canceled) {
			return st, e
		}
	}
	if err := ctx.Err(); err != nil {
		return st, err
	}
	if err == nil {
		// The extractor took a whole archive, which the check only
		// passes on once the source has ended well; what is left is the
		// pipes' complaint about padding nobody read.
		return st, nil
	}
	return st, errors.Join(errs...)
}

func copyLimitError(p string, left int64) error {
	return errdefs.Newf(errdefs.ErrResourceExhausted,
		"the files under %s are larger than what is left of the grade's copy limit (max_copy_bytes, default 1 GiB), %d bytes: raise it or copy less", p, max(left, 0))
}

// tarCheck passes an archive through unchanged while it reads its
// headers: it refuses fifos and devices, a top-level link, an entry outside
// the copied tree, and more entries or file data than the budget has left.
type tarCheck struct {
	root   string
	budget *gradeBudget
}

func (c *tarCheck) copy(w io.Writer, r io.Reader) error {
	tr := tar.NewReader(io.TeeReader(r, w))
	base := path.Base(c.root)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fmt.Errorf("read the archive of %s: %w", c.root, err)
		}
		name := strings.TrimSuffix(h.Name, "/")
		abs := path.Join(path.Dir(c.root), name)
		if name != base && !strings.HasPrefix(name, base+"/") || path.Clean(name) != name {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "the archive of %s holds %.200q, outside it", c.root, h.Name)
		}
		switch h.Typeflag {
		case tar.TypeReg, tar.TypeDir:
		case tar.TypeSymlink, tar.TypeLink:
			if name == base {
				return errdefs.Newf(errdefs.ErrFailedPrecondition,
					"%s is a symbolic link (to %.200q): a grade copies what is at a path and never follows links; name the directory or file itself", c.root, h.Linkname)
			}
		case tar.TypeFifo:
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s is a fifo: only regular files, directories and symbolic links are copied; remove it or name the paths around it", abs)
		case tar.TypeChar, tar.TypeBlock:
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s is a device node: only regular files, directories and symbolic links are copied; remove it or name the paths around it", abs)
		case tar.TypeXHeader, tar.TypeXGlobalHeader, tar.TypeGNULongName, tar.TypeGNULongLink:
			continue
		default:
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "%s has tar type %q, which a grade does not copy", abs, h.Typeflag)
		}
		c.budget.entries--
		if c.budget.entries < 0 {
			return errdefs.Newf(errdefs.ErrResourceExhausted, "more than %d files, directories and links to copy: copy fewer paths", maxGradeEntries)
		}
		if h.Typeflag == tar.TypeReg {
			c.budget.bytes -= h.Size
			if c.budget.bytes < 0 {
				return copyLimitError(c.root, c.budget.bytes+h.Size)
			}
		}
	}
	// The end of an archive may be padded past its two zero blocks.
	if _, err := io.Copy(w, r); err != nil {
		return err
	}
	return nil
}
