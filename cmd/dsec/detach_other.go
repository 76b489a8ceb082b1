//go:build !unix && !dsec_client

package main

import "syscall"

func detachAttr() *syscall.SysProcAttr { return nil }
