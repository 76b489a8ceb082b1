//go:build !linux

// Command pack measures pack_diff; it needs Linux.
package main

import "log"

func main() { log.Fatal("bench/pack needs Linux") }
