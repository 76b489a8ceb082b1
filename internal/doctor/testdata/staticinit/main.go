// Command staticinit stands in for the dsec binary in doctor's tests: built
// statically with cgo it carries internal/nsexec's sandbox init (like
// `make build`), built with CGO_ENABLED=0 it does not.
package main

import _ "github.com/dsecproject/dsec/internal/nsexec" // the sandbox init

func main() {}
