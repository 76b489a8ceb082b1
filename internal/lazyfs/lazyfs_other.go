//go:build !linux

package lazyfs

import "errors"

// Conn is one mounted blob; lazy layers need Linux.
type Conn struct{}

// Mount is not supported off Linux.
func Mount(Config, Blob) (*Conn, error) { return nil, errors.ErrUnsupported }

// Path is empty off Linux.
func (*Conn) Path() string { return "" }

// Stats is empty off Linux.
func (*Conn) Stats() Stats { return Stats{} }

// Abort does nothing off Linux.
func (*Conn) Abort() {}

// Close does nothing off Linux.
func (*Conn) Close() error { return nil }

// MountControl is not supported off Linux.
func MountControl(string) error { return errors.ErrUnsupported }

// UnmountControl does nothing off Linux.
func UnmountControl(string) error { return nil }

// Cleanup does nothing off Linux.
func Cleanup(string) error { return nil }
