//go:build unix && !dsec_client

package main

import "syscall"

// detachAttr starts a process in its own session, so that it outlives
// the terminal that started it.
func detachAttr() *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }
