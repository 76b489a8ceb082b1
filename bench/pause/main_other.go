//go:build !linux

// Command pause measures pausing and resuming sandboxes; it needs Linux.
package main

import "log"

func main() { log.Fatal("bench/pause needs Linux") }
