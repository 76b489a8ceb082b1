//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package main

import (
	"errors"
	"os"
)

// On this OS the CLI runs no TTY execs: no terminal is ever detected.

func isTerminal(uintptr) bool { return false }

func makeRaw(uintptr) (func(), error) { return nil, errors.ErrUnsupported }

func termSize(uintptr) (int, int, error) { return 0, 0, errors.ErrUnsupported }

func notifyResize(chan<- os.Signal) func() { return func() {} }
