package dsec

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// chunkSize is the most data one streamed message carries.
const chunkSize = 1 << 20

// File types (FileInfo.Type).
const (
	TypeFile    = "file"
	TypeDir     = "dir"
	TypeSymlink = "symlink"
	TypeFIFO    = "fifo"
	TypeSocket  = "socket"
	TypeDevice  = "device"
)

// FileInfo describes a file in a sandbox.
type FileInfo struct {
	// Path is the file's path in the sandbox.
	Path string
	// Name is the base name (set in directory listings).
	Name string
	// Type is one of the Type* constants; empty when the server did not
	// say.
	Type string
	// LinkTarget is a symlink's target.
	LinkTarget string
	Size       int64
	// Mode holds the permission bits and the type bits (fs.ModeDir,
	// fs.ModeSymlink, …).
	Mode    fs.FileMode
	ModTime time.Time
	IsDir   bool
	// UID and GID own the file, as seen in the sandbox.
	UID int
	GID int
}

// FileOption changes how WriteFile, Upload, MakeDir, UploadTar and
// UploadDir create files. UploadTar and UploadDir take the owner and
// WithMakeParents (which creates the destination directory) and ignore
// the mode: the archive's modes are kept. UploadDir and DownloadDir take
// WithMaxSize; DownloadDir ignores the rest.
type FileOption func(*fileOptions)

type fileOptions struct {
	mode        uint32
	makeParents bool
	owner       string
	maxSize     int64
}

// WithMode sets the file's permission bits (default 0644, 0755 for
// MakeDir). Setuid, setgid and sticky bits are kept; other type bits are
// ignored.
func WithMode(mode fs.FileMode) FileOption {
	return func(o *fileOptions) { o.mode = unixMode(mode) }
}

// WithMakeParents creates missing parent directories (mode 0755); for
// UploadTar and UploadDir, the destination directory too.
func WithMakeParents() FileOption {
	return func(o *fileOptions) { o.makeParents = true }
}

// WithMaxSize bounds a copy of a tree, UploadDir's or DownloadDir's: the
// apparent sizes of its files, holes included, may add up to at most n
// bytes. The file that would pass it is refused with a *SizeLimitError
// before any of it is copied. Zero or less means no bound.
func WithMaxSize(n int64) FileOption {
	return func(o *fileOptions) { o.maxSize = n }
}

// WithOwner makes user own the file (or directory, or everything
// extracted): a name, uid or uid:gid in the sandbox (default root).
func WithOwner(user string) FileOption {
	return func(o *fileOptions) { o.owner = user }
}

// ReadFile returns the contents of a regular file in the sandbox.
func (s *Sandbox) ReadFile(ctx context.Context, path string) ([]byte, error) {
	var buf bytes.Buffer
	if _, err := s.Download(ctx, path, &buf); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Download writes a regular file of the sandbox to w as it streams in and
// returns the file's description.
func (s *Sandbox) Download(ctx context.Context, path string, w io.Writer) (FileInfo, error) {
	if err := s.check(); err != nil {
		return FileInfo{}, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := s.c.sandboxes.ReadFile(ctx, connect.NewRequest(&sandboxv1.ReadFileRequest{SandboxId: s.ID, Path: path}))
	if err != nil {
		return FileInfo{}, s.c.err(err)
	}
	defer stream.Close()
	var info FileInfo
	for stream.Receive() {
		msg := stream.Msg()
		if msg.GetInfo() != nil {
			info = fileInfo(msg.GetInfo())
		}
		if len(msg.GetData()) == 0 {
			continue
		}
		if _, err := w.Write(msg.GetData()); err != nil {
			return FileInfo{}, fmt.Errorf("download %s from sandbox %s: %w", path, s.ID, err)
		}
	}
	if err := stream.Err(); err != nil {
		return FileInfo{}, s.c.err(err)
	}
	return info, nil
}

// WriteFile writes data to a regular file in the sandbox, replacing it.
func (s *Sandbox) WriteFile(ctx context.Context, path string, data []byte, opts ...FileOption) error {
	_, err := s.Upload(ctx, path, bytes.NewReader(data), opts...)
	return err
}

// Upload writes everything r yields to a regular file in the sandbox,
// replacing it, streamed in chunks of at most 1 MiB. If reading r fails,
// the upload is abandoned and the file is left as it was.
func (s *Sandbox) Upload(ctx context.Context, path string, r io.Reader, opts ...FileOption) (FileInfo, error) {
	if err := s.check(); err != nil {
		return FileInfo{}, err
	}
	var fo fileOptions
	for _, o := range opts {
		o(&fo)
	}
	header := &sandboxv1.WriteFileHeader{SandboxId: s.ID, Path: path, Mode: fo.mode, MakeParents: fo.makeParents, User: fo.owner}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream := s.c.sandboxes.WriteFile(ctx)
	resp, err := sendChunks(stream, cancel,
		&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Header{Header: header}},
		r, func(b []byte) *sandboxv1.WriteFileRequest {
			return &sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Data{Data: b}}
		})
	if err != nil {
		var re *readError
		if errors.As(err, &re) {
			return FileInfo{}, fmt.Errorf("upload %s to sandbox %s: %w", path, s.ID, re.err)
		}
		return FileInfo{}, s.c.err(err)
	}
	return fileInfo(resp.Msg.GetInfo()), nil
}

// readError marks a failure to read the caller's reader.
type readError struct{ err error }

func (e *readError) Error() string { return "read: " + e.err.Error() }
func (e *readError) Unwrap() error { return e.err }

// sendChunks sends header, then what r yields in messages of at most
// chunkSize bytes, and returns the response. When reading r fails it
// cancels the stream (so the server does not keep a partial upload) and
// returns a *readError.
func sendChunks[Req, Res any](stream *connect.ClientStreamForClient[Req, Res], cancel context.CancelFunc, header *Req, r io.Reader, data func([]byte) *Req) (*connect.Response[Res], error) {
	if err := stream.Send(header); err != nil {
		return closeAndReceive(stream, err)
	}
	size := chunkSize
	if l, ok := r.(interface{ Len() int }); ok && l.Len() < size {
		size = l.Len() + 1 // room to see the end in one read
	}
	buf := make([]byte, size)
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			// Send marshals the message before it returns, so buf can be
			// reused.
			if err := stream.Send(data(buf[:n])); err != nil {
				return closeAndReceive(stream, err)
			}
		}
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			break
		}
		if rerr != nil {
			cancel()
			_, _ = stream.CloseAndReceive()
			return nil, &readError{err: rerr}
		}
	}
	return stream.CloseAndReceive()
}

// closeAndReceive ends a stream whose Send failed. io.EOF from Send means
// the server ended the call; its reason comes with the response.
func closeAndReceive[Req, Res any](stream *connect.ClientStreamForClient[Req, Res], sendErr error) (*connect.Response[Res], error) {
	resp, err := stream.CloseAndReceive()
	if !errors.Is(sendErr, io.EOF) {
		return nil, sendErr
	}
	if err != nil {
		return nil, err
	}
	return resp, nil
}

// typeModes are the fs.FileMode type bits of the file types.
var typeModes = map[string]fs.FileMode{
	TypeDir:     fs.ModeDir,
	TypeSymlink: fs.ModeSymlink,
	TypeFIFO:    fs.ModeNamedPipe,
	TypeSocket:  fs.ModeSocket,
	TypeDevice:  fs.ModeDevice,
}

func fileInfo(p *sandboxv1.FileInfo) FileInfo {
	isDir := p.GetIsDir() || p.GetType() == TypeDir
	fi := FileInfo{
		Path:       p.GetPath(),
		Name:       p.GetName(),
		Type:       p.GetType(),
		LinkTarget: p.GetLinkTarget(),
		Size:       p.GetSize(),
		Mode:       goMode(p.GetMode(), isDir) | typeModes[p.GetType()],
		ModTime:    timeOf(p.GetModTime()),
		IsDir:      isDir,
		UID:        int(p.GetUid()),
		GID:        int(p.GetGid()),
	}
	return fi
}

// goMode converts Unix permission bits (st_mode's low 12 bits) to an
// fs.FileMode.
func goMode(m uint32, dir bool) fs.FileMode {
	mode := fs.FileMode(m & 0o777)
	if m&0o4000 != 0 {
		mode |= fs.ModeSetuid
	}
	if m&0o2000 != 0 {
		mode |= fs.ModeSetgid
	}
	if m&0o1000 != 0 {
		mode |= fs.ModeSticky
	}
	if dir {
		mode |= fs.ModeDir
	}
	return mode
}

// unixMode converts an fs.FileMode to Unix permission bits.
func unixMode(m fs.FileMode) uint32 {
	out := uint32(m.Perm())
	if m&fs.ModeSetuid != 0 {
		out |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		out |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		out |= 0o1000
	}
	return out
}
