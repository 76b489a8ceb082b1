package container

import (
	"context"

	"github.com/dsecproject/dsec/internal/sandbox"
)

// ListSessions implements sandbox.Sessioner: the keeper runs the sessions
// (keeper/session_linux.go).
func (b *Backend) ListSessions(ctx context.Context, id string) ([]sandbox.SessionInfo, error) {
	in, err := b.keeper.ListSessions(ctx, id)
	if err != nil {
		return nil, err
	}
	out := make([]sandbox.SessionInfo, len(in))
	for i, s := range in {
		out[i] = sandbox.SessionInfo{Name: s.Name, Shell: s.Shell, Created: s.Created, Commands: s.Commands, RunningExec: s.RunningExec}
	}
	return out, nil
}

// DeleteSession implements sandbox.Sessioner.
func (b *Backend) DeleteSession(ctx context.Context, id, name string) error {
	return b.keeper.DeleteSession(ctx, id, name)
}

var _ sandbox.Sessioner = (*Backend)(nil)
