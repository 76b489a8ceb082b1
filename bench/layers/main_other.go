//go:build !linux

// Command layers measures composable layers against per-sandbox tar
// extraction; it needs Linux.
package main

import "log"

func main() { log.Fatal("bench/layers needs Linux") }
