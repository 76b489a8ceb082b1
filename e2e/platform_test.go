// Package e2e runs the real dsec binary: `dsec up` as a separate process,
// driven through the Go SDK and the CLI, with real sandboxes.
package e2e

import (
	"testing"

	testplatform "github.com/dsecproject/dsec/internal/testenv/platform"
)

// platform is one `dsec up` of a test (internal/testenv/platform), with the
// e2e tests' own helpers as methods.
type platform struct{ *testplatform.Platform }

func freePort(t *testing.T) string { return testplatform.FreePort(t) }

func randHex(n int) string { return testplatform.RandHex(n) }

// newPlatform starts dsec up with node name e2e and registers cleanup that
// stops it, its keeper and every sandbox, and checks nothing is left on
// the host. Each option may set fields of the platform before it starts.
func newPlatform(t *testing.T, opts ...func(*platform)) *platform {
	t.Helper()
	w := &platform{}
	w.Platform = testplatform.New(t, "e2e", func(p *testplatform.Platform) {
		w.Platform = p
		for _, o := range opts {
			o(w)
		}
	})
	return w
}
