package keeper

import (
	"os"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// CheckNamespaces refuses a process that is not in the namespaces
// recorded of it.
func TestCheckNamespaces(t *testing.T) {
	pid := os.Getpid()
	rec, err := namespacesOf(pid)
	if err != nil {
		t.Fatal(err)
	}
	for _, n := range []string{"mnt", "pid", "user", "net"} {
		if rec[n] == (NSID{}) {
			t.Errorf("namespacesOf(self) has no %s namespace: %v", n, rec)
		}
	}
	if err := CheckNamespaces(pid, rec); err != nil {
		t.Errorf("CheckNamespaces(self, its own) = %v, want nil", err)
	}
	if err := CheckNamespaces(pid, nil); err != nil {
		t.Errorf("CheckNamespaces(self, nothing recorded) = %v, want nil", err)
	}
	moved := map[string]NSID{}
	for k, v := range rec {
		moved[k] = v
	}
	m := moved["mnt"]
	m.Ino++
	moved["mnt"] = m
	if err := CheckNamespaces(pid, moved); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CheckNamespaces(self, another mount namespace) = %v, want FailedPrecondition", err)
	}
	if err := CheckNamespaces(1<<30, rec); !errdefs.Is(err, errdefs.ErrFailedPrecondition) {
		t.Errorf("CheckNamespaces(no such process) = %v, want FailedPrecondition", err)
	}
}
