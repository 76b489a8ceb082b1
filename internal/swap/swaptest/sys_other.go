//go:build !linux

package swaptest

import "errors"

func swapoff(string) error { return errors.ErrUnsupported }
