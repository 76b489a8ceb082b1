package container

import (
	"context"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

var _ sandbox.Pauser = (*Backend)(nil)

// pauseProtocol is the first keeper protocol with pause and resume.
const pauseProtocol = 6

// Pause implements sandbox.Pauser: it returns once every process of the
// sandbox is stopped; its memory then moves out of RAM in the keeper, in
// the background (Stats.SwappedBytes grows), so the PauseInfo returned is
// where the memory was at that moment. Pausing a paused sandbox changes
// nothing and reports it. A sandbox that is not running is
// FailedPrecondition; one that does not stop within the keeper's bound
// (a process stuck in the kernel) is Unavailable with a retry hint, and
// runs on.
func (b *Backend) Pause(ctx context.Context, id string) (sandbox.PauseInfo, error) {
	if err := b.checkPauseProtocol(ctx); err != nil {
		return sandbox.PauseInfo{}, err
	}
	info, err := b.keeper.Pause(ctx, id, false)
	return fromKeeperPause(info), err
}

// Resume implements sandbox.Pauser: it returns once the sandbox's
// processes run again; what was resident at the pause is being read back
// in the background. Resuming a running sandbox changes nothing and
// reports it.
func (b *Backend) Resume(ctx context.Context, id string) (sandbox.PauseInfo, error) {
	if err := b.checkPauseProtocol(ctx); err != nil {
		return sandbox.PauseInfo{}, err
	}
	info, err := b.keeper.Resume(ctx, id, false)
	return fromKeeperPause(info), err
}

// checkPauseProtocol refuses pause and resume on a keeper that has them
// not: an older keeper would answer 404, which reads as "no such sandbox".
func (b *Backend) checkPauseProtocol(ctx context.Context) error {
	v, err := b.keeper.Version(ctx)
	if err != nil {
		return err
	}
	if v.Protocol < pauseProtocol {
		return errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) speaks keeper protocol %d, which cannot pause sandboxes: restart dsec up once the sandboxes on lazy layers it serves are gone, so that a keeper of this dsec replaces it", v.Pid, v.Protocol)
	}
	return nil
}

func fromKeeperPause(p keeper.PauseInfo) sandbox.PauseInfo {
	return sandbox.PauseInfo{Resident: p.Resident, Swapped: p.Swapped}
}
