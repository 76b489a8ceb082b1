package dsec

import (
	"context"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Paths in these calls are resolved in the sandbox's own view of its file
// system: symlinks and .. cannot leave it.

// Stat describes a file in the sandbox, following symlinks inside it.
func (s *Sandbox) Stat(ctx context.Context, path string) (FileInfo, error) {
	if err := s.check(); err != nil {
		return FileInfo{}, err
	}
	resp, err := s.c.sandboxes.Stat(ctx, connect.NewRequest(&sandboxv1.StatRequest{SandboxId: s.ID, Path: path}))
	if err != nil {
		return FileInfo{}, s.c.err(err)
	}
	return fileInfo(resp.Msg.GetInfo()), nil
}

// ListDir lists a directory of the sandbox (symlinks are listed, not
// followed). truncated says the server left entries out past its limit
// (10000).
func (s *Sandbox) ListDir(ctx context.Context, path string) (entries []FileInfo, truncated bool, err error) {
	if err := s.check(); err != nil {
		return nil, false, err
	}
	resp, err := s.c.sandboxes.ListDir(ctx, connect.NewRequest(&sandboxv1.ListDirRequest{SandboxId: s.ID, Path: path}))
	if err != nil {
		return nil, false, s.c.err(err)
	}
	entries = make([]FileInfo, 0, len(resp.Msg.GetEntries()))
	for _, e := range resp.Msg.GetEntries() {
		entries = append(entries, fileInfo(e))
	}
	return entries, resp.Msg.GetTruncated(), nil
}

// MakeDir makes a directory in the sandbox: mode 0755 unless WithMode,
// owned by root unless WithOwner, with its missing parents when
// WithMakeParents (an existing directory is then no error).
func (s *Sandbox) MakeDir(ctx context.Context, path string, opts ...FileOption) error {
	if err := s.check(); err != nil {
		return err
	}
	var fo fileOptions
	for _, o := range opts {
		o(&fo)
	}
	_, err := s.c.sandboxes.MakeDir(ctx, connect.NewRequest(&sandboxv1.MakeDirRequest{
		SandboxId: s.ID, Path: path, Mode: fo.mode, Parents: fo.makeParents, User: fo.owner,
	}))
	return s.c.err(err)
}

// Remove removes a file or an empty directory of the sandbox, or a whole
// tree when recursive.
func (s *Sandbox) Remove(ctx context.Context, path string, recursive bool) error {
	if err := s.check(); err != nil {
		return err
	}
	_, err := s.c.sandboxes.Remove(ctx, connect.NewRequest(&sandboxv1.RemoveRequest{SandboxId: s.ID, Path: path, Recursive: recursive}))
	return s.c.err(err)
}

// Rename renames a file or directory of the sandbox. An existing to is
// ErrAlreadyExists unless overwrite.
func (s *Sandbox) Rename(ctx context.Context, from, to string, overwrite bool) error {
	if err := s.check(); err != nil {
		return err
	}
	_, err := s.c.sandboxes.Rename(ctx, connect.NewRequest(&sandboxv1.RenameRequest{SandboxId: s.ID, From: from, To: to, Overwrite: overwrite}))
	return s.c.err(err)
}
