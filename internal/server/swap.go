package server

import (
	"log/slog"

	"github.com/dsecproject/dsec/internal/swap"
)

// setupSwap gives the node the swap file of cfg.Swap, which paused
// sandboxes' memory goes to (docs/pause.md), and returns what turns it off
// again. dsec up owns the file, not the keeper that outlives it: a swap
// file is the whole host's, so it is on only while dsec up runs. A swap
// file an earlier dsec up left on (it crashed, or was killed) is turned
// off first, or taken as it is when it is the one asked for.
func setupSwap(cfg Config, log *slog.Logger) (off func(), err error) {
	if cfg.Swap.Path == "" {
		rec, err := swap.Disable(cfg.StateDir, log)
		if err != nil {
			return nil, err
		}
		if rec.Path != "" {
			log.Info("turned off the swap file an earlier dsec up left", "path", rec.Path)
		}
		return func() {}, nil
	}
	st, err := swap.Enable(cfg.StateDir, cfg.Swap, log)
	if err != nil {
		return nil, err
	}
	log.Info("swap file for paused sandboxes", "path", st.Record.Path, "size", st.Record.Size, "used", st.Used)
	return func() {
		// Paused sandboxes' memory comes back into RAM (they stay
		// paused); a swapoff that fails leaves the record for dsec down,
		// dsec purge or the next dsec up.
		if _, err := swap.Disable(cfg.StateDir, log); err != nil {
			log.Error("turn off the swap file: run dsec down or dsec purge", "path", cfg.Swap.Path, "err", err)
		}
	}, nil
}
