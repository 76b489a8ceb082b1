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
