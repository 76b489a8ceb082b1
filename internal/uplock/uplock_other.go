//go:build !linux

package uplock

import "errors"

// Lock is held by the running `dsec up` for its whole life.
type Lock struct{}

// Acquire is Linux-only.
func Acquire(string) (*Lock, error) { return nil, errors.ErrUnsupported }

// Record is Linux-only.
func (l *Lock) Record(string) error { return errors.ErrUnsupported }

// Release is Linux-only.
func (l *Lock) Release() {}

// Running is Linux-only.
func Running(string) (Record, bool, error) { return Record{}, false, errors.ErrUnsupported }

// Alive is Linux-only.
func (r Record) Alive() bool { return false }
