//go:build !linux || !cgo

package nsexec

import (
	"errors"
	"fmt"
	"os"
)

// Spawn needs Linux namespaces and the cgo part of this package; elsewhere it
// returns errors.ErrUnsupported.
func Spawn(self string, cfg ExecConfig, stdio [3]*os.File) (helperPid, childPid int, err error) {
	return 0, 0, fmt.Errorf("exec in a sandbox needs Linux and a cgo build: %w", errors.ErrUnsupported)
}

// Zygote is an exec zygote; it needs Linux and a cgo build.
type Zygote struct{}

// StartZygote returns errors.ErrUnsupported outside Linux or without cgo.
func StartZygote(self string) (*Zygote, error) {
	return nil, fmt.Errorf("an exec zygote needs Linux and a cgo build: %w", errors.ErrUnsupported)
}

// Pid returns 0.
func (z *Zygote) Pid() int { return 0 }

// Spawn returns errors.ErrUnsupported.
func (z *Zygote) Spawn(cfg ExecConfig, stdio [3]*os.File) (childPid int, err error) {
	return 0, fmt.Errorf("exec in a sandbox needs Linux and a cgo build: %w", errors.ErrUnsupported)
}

// Close does nothing.
func (z *Zygote) Close() error { return nil }
