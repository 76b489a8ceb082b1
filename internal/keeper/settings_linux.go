package keeper

import (
	"slices"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// currentSettings returns the settings the keeper runs with.
func (k *Keeper) currentSettings() Settings {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.settings
}

// applySettings changes the keeper's live settings to want's; it refuses
// when want differs in a setting that does not change live (the edge
// restarts the keeper for those, see Compare).
func (k *Keeper) applySettings(want Settings) (Settings, error) {
	n, err := want.Normalize(k.cfg.StateDir)
	if err != nil {
		return Settings{}, errdefs.Newf(errdefs.ErrInvalidArgument, "keeper settings: %v", err)
	}
	k.mu.Lock()
	cur := k.settings
	k.mu.Unlock()
	changes := Compare(cur, n)
	if Worst(changes) != Live {
		return Settings{}, errdefs.Newf(errdefs.ErrFailedPrecondition,
			"keeper settings %s do not change in a running keeper: it must be restarted", Describe(changes))
	}
	if len(changes) == 0 {
		return cur, nil
	}
	if k.ct != nil {
		k.ct.setWarmPool(n.WarmPool)
	}
	k.mu.Lock()
	k.settings.WarmPool = n.WarmPool
	cur = k.settings
	k.mu.Unlock()
	k.log.Info("keeper settings changed live", "changes", Describe(changes))
	return cur, nil
}

// driverNames lists the keeper's sandbox drivers.
func (k *Keeper) driverNames() []string {
	names := make([]string, 0, len(k.drivers))
	for n := range k.drivers {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}
