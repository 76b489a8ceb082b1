package container

import (
	"context"
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/keeper"
)

// settings are the keeper settings this backend asks for.
func (c Config) settings() keeper.Settings {
	return keeper.Config{
		Runtime: c.Runtime, CgroupParent: c.CgroupParent, IDMap: c.IDMap, UIDRanges: c.UIDRanges,
		HostPidsReserve: c.HostPidsReserve, HostMemoryReserve: c.HostMemoryReserve,
		DiskQuota: c.DiskQuota, WarmPool: c.WarmPool,
		BlobSource: c.BlobSource, ChunkCache: c.ChunkCache, ChunkCacheSize: c.ChunkCacheSize, ChunkSize: c.ChunkSize,
		NetworkConfig: c.NetworkConfig,
	}.Settings()
}

// ensureKeeper makes sure the node's keeper runs this dsec's code with
// this backend's settings: it starts one when none answers, and of one
// that runs it checks the protocol, version and settings (plan).
func (b *Backend) ensureKeeper(ctx context.Context) error {
	want, err := b.cfg.settings().Normalize(b.cfg.StateDir)
	if err != nil {
		return err
	}
	v, err := b.keeper.Version(ctx)
	if err != nil {
		return keeper.Start(ctx, b.cfg.Self, b.cfg.StateDir, want)
	}
	have, err := runningSettings(v, b.cfg.StateDir)
	if err != nil {
		return err
	}
	infos, err := b.keeper.List(ctx)
	if err != nil {
		return err
	}
	p, err := plan(v, have, want, b.cfg.Version, infos, b.cfg.StateDir)
	if err != nil {
		return err
	}
	if p.kept > 0 {
		b.log.Warn("the node keeper is not replaced while sandboxes on lazy layers, whose data it serves, need it; it is at the first start of dsec up after they are gone",
			"pid", v.Pid, "why", p.why, "lazy_sandboxes", p.kept)
	}
	switch p.action {
	case useKeeper:
		if v.Version != b.cfg.Version {
			b.log.Warn("the node keeper runs another dsec version, which serves this one", "keeper", v.Version, "edge", b.cfg.Version, "protocol", v.Protocol)
		}
		return nil
	case applyLive:
		if _, err := b.keeper.ApplySettings(ctx, want); err != nil {
			return fmt.Errorf("change the node keeper's settings: %w", err)
		}
		b.log.Info("changed the node keeper's settings", "changes", keeper.Describe(p.changes))
		return nil
	}
	b.log.Warn("replacing the node keeper; the new one adopts its sandboxes",
		"pid", v.Pid, "why", p.why, "sandboxes", len(infos), "running_execs", p.running)
	if p.running > 0 {
		b.log.Warn("execs running in the old keeper are reported lost: no keeper sees their end", "running_execs", p.running)
	}
	return keeper.Takeover(ctx, b.cfg.Self, b.cfg.StateDir, want, v)
}

// runningSettings are the settings of the running keeper v, normalized:
// those it reports, or, from a protocol 2 keeper, which does not, those
// of its command line.
func runningSettings(v keeper.Version, stateDir string) (keeper.Settings, error) {
	if v.Settings != nil {
		return v.Settings.Normalize(stateDir)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(v.Pid) + "/cmdline")
	if err != nil {
		return keeper.Settings{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d, keeper protocol %d) does not say its settings and its command line cannot be read (%v): stop it, or run dsec as root", v.Pid, v.Protocol, err)
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i, a := range argv {
		if a == "keeper" {
			argv = argv[i+1:]
			break
		}
	}
	s, err := keeper.SettingsFromArgs(argv)
	if err != nil {
		return keeper.Settings{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the settings of the node keeper (pid %d, keeper protocol %d) cannot be read from its command line (%v): stop it", v.Pid, v.Protocol, err)
	}
	return s.Normalize(stateDir)
}

// keeperAction is what the edge does with a keeper it finds running.
type keeperAction int

const (
	useKeeper     keeperAction = iota // as it is
	applyLive                         // after changing live settings
	replaceKeeper                     // by a new keeper, which adopts its sandboxes
)

type keeperPlan struct {
	action  keeperAction
	why     string          // why it is replaced
	changes []keeper.Change // settings that differ
	running int             // execs the old keeper runs, lost by a replacement
	// kept counts the sandboxes on lazy layers for which a keeper that
	// should be replaced (why) is kept.
	kept int
	// upgrade: it is replaced for its code (protocol or version), not for
	// its settings.
	upgrade bool
}

// plan decides what to do with the running keeper v of settings have
// (normalized), holding infos, for an edge of version that wants the
// settings want (normalized):
//   - an older protocol or another dsec version (when both are known):
//     replace it by this dsec's keeper, which adopts the sandboxes (execs
//     it runs end lost, said so);
//   - settings that need a restart: the same, unless execs run in it, which
//     would be lost: then refuse, with the flags to pass as before;
//   - settings that change live only: change them;
//   - fixed settings (part of what a sandbox is) while it holds sandboxes,
//     or sandboxes on lazy layers (whose data it serves) when settings
//     need it replaced: refuse, with what to run instead;
//   - sandboxes on lazy layers when only its version or protocol differs:
//     keep it (it serves this dsec), and say so;
//   - a newer keeper that still serves this dsec's protocol and has the
//     same settings: use it.
func plan(v keeper.Version, have, want keeper.Settings, version string, infos []keeper.SandboxInfo, stateDir string) (keeperPlan, error) {
	p := keeperPlan{changes: keeper.Compare(have, want)}
	for _, in := range infos {
		p.running += in.RunningExecs
	}
	worst := keeper.Worst(p.changes)
	switch {
	case v.Protocol > keeper.Protocol && v.MinProtocol > keeper.Protocol:
		return p, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) is from dsec %s, which no longer serves this dsec (%s): run dsec %s or later, or stop the keeper with `dsec purge --state-dir %s` (which deletes its sandboxes)",
			v.Pid, v.Version, version, v.Version, stateDir)
	case v.Protocol < keeper.Protocol:
		p.why, p.upgrade = fmt.Sprintf("it speaks keeper protocol %d, this dsec %d", v.Protocol, keeper.Protocol), true
	case v.Version != version && v.Protocol == keeper.Protocol && v.Version != "" && version != "":
		p.why, p.upgrade = fmt.Sprintf("it runs dsec %s, this is dsec %s", v.Version, version), true
	case worst == keeper.Live && len(p.changes) > 0:
		p.action = applyLive
		return p, nil
	case worst == keeper.Live:
		return p, nil
	default:
		p.why = "it runs with " + keeper.Describe(p.changes)
	}
	if worst == keeper.Fixed && len(infos) > 0 {
		var keep []string
		for _, c := range p.changes {
			if c.Class == keeper.Fixed {
				keep = append(keep, c.Flag+" "+c.Have)
			}
		}
		return p, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) runs with %s and holds %d sandboxes, which are made with those settings: start dsec up with %s as before; to change them, delete the sandboxes first (`dsec ps -q | xargs dsec rm`) and start dsec up again, or remove everything with `dsec purge --state-dir %s`",
			v.Pid, keeper.Describe(p.changes), len(infos), strings.Join(keep, " "), stateDir)
	}
	lazy := 0
	for _, in := range infos {
		if in.Lazy {
			lazy++
		}
	}
	if lazy == 0 && v.Settings == nil && have.BlobSource != "" {
		lazy = len(infos) // a protocol 2 keeper does not say which
	}
	if lazy > 0 && worst == keeper.Live {
		// Only its code differs, and it serves this dsec (a protocol 2
		// keeper reads every request this dsec sends it): kept until its
		// lazy sandboxes are gone, and said so.
		p.action, p.kept = useKeeper, lazy
		if len(p.changes) > 0 && v.Settings != nil {
			p.action = applyLive
		}
		return p, nil
	}
	if lazy > 0 {
		return p, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) must be replaced (%s), but %d of its sandboxes read lazy layers whose data it serves, which a new keeper cannot take over: run dsec %s with the settings it has until they are deleted, or remove everything with `dsec purge --state-dir %s`",
			v.Pid, p.why, lazy, v.Version, stateDir)
	}
	if p.running > 0 && !p.upgrade {
		// A new keeper for a setting would lose what runs; an upgrade
		// may (said so), a flag changed in passing should not.
		var keep []string
		for _, c := range p.changes {
			if c.Class != keeper.Live {
				keep = append(keep, c.Flag+" "+c.Have)
			}
		}
		return p, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"the node keeper (pid %d) runs with %s; changing that takes a new keeper, and the %d execs running in it would be lost: start dsec up with %s as before, or again once they have ended",
			v.Pid, keeper.Describe(p.changes), p.running, strings.Join(keep, " "))
	}
	p.action = replaceKeeper
	return p, nil
}
