// Command lazyspike is the spike of issue 7 (layers loaded on demand): it
// builds a synthetic EROFS layer, serves it through a FUSE file system that
// fetches 1 MiB chunks from a simulated remote store into a node-local
// chunk cache, mounts EROFS on top in two ways (the whole image on FUSE;
// a local metadata-only image with device= on FUSE) and measures cold and
// warm reads, page-cache duplication and what server faults do to a
// mounted layer. It prints a table and writes JSON. Run as root on Linux:
//
//	go run ./bench/lazyspike -json bin/lazyspike.json
//
// Findings are in docs/lazy-layers.md.
package main

import (
	"fmt"
	"os"
)

func main() {
	var err error
	switch {
	case len(os.Args) > 1 && os.Args[1] == "-serve":
		err = serveMain(os.Args[2:])
	case len(os.Args) == 3 && (os.Args[1] == "-read" || os.Args[1] == "-walk"):
		err = readerMain(os.Args[1][1:], os.Args[2])
	default:
		err = run(os.Args[1:])
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "lazyspike:", err)
		os.Exit(1)
	}
}
