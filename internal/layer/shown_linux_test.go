package layer

import "testing"

// TestShownPaths checks that a message users see names a diff's file by
// its path in the sandbox, not by the host path of the upper directory,
// and a directory build's file by the path the user gave.
func TestShownPaths(t *testing.T) {
	for _, tt := range []struct {
		s    scanner
		want string
	}{
		{scanner{dir: "/var/lib/dsec/sandboxes/n1-abc/upper", inSandbox: true}, "/etc/passwd in the sandbox changed while the layer was built; stop what writes to it and build again"},
		{scanner{dir: "./rootfs"}, "./rootfs/etc/passwd changed while the layer was built; stop what writes to it and build again"},
	} {
		if got := tt.s.changed("etc/passwd").Error(); got != tt.want {
			t.Errorf("changed(etc/passwd) in %s = %q, want %q", tt.s.dir, got, tt.want)
		}
	}
}
