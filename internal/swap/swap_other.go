//go:build !linux

package swap

import (
	"errors"
	"log/slog"
)

// Enable is Linux-only.
func Enable(string, Spec, *slog.Logger) (Status, error) { return Status{}, errors.ErrUnsupported }

// Disable is Linux-only; with no record it does nothing.
func Disable(stateDir string, _ *slog.Logger) (Record, error) {
	rec, ok, err := ReadRecord(stateDir)
	if err != nil || !ok {
		return rec, err
	}
	return rec, errors.ErrUnsupported
}

// Current is Linux-only; it reports the record alone.
func Current(stateDir string) (Status, error) {
	rec, _, err := ReadRecord(stateDir)
	return Status{Record: rec}, err
}
