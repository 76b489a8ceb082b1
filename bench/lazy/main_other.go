//go:build !linux

// Command lazy measures lazy layers against eager pulls; it needs Linux.
package main

import "log"

func main() { log.Fatal("bench/lazy needs Linux") }
