package swap

import (
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestParseSwaps(t *testing.T) {
	text := "Filename\t\t\t\tType\t\tSize\t\tUsed\t\tPriority\n" +
		"/dev/vdb                                partition\t1048572\t\t0\t\t-2\n" +
		"/var/tmp/my\\040swap                     file\t\t65532\t\t1024\t\t-3\n"
	got, err := ParseSwaps(text)
	if err != nil {
		t.Fatal(err)
	}
	want := []SwapEntry{
		{Path: "/dev/vdb", Type: "partition", Size: 1048572 << 10, Used: 0, Priority: -2},
		{Path: "/var/tmp/my swap", Type: "file", Size: 65532 << 10, Used: 1024 << 10, Priority: -3},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("ParseSwaps (-want +got):\n%s", diff)
	}
	if _, err := ParseSwaps("Filename Type Size Used Priority\n/x file 12\n"); err == nil {
		t.Errorf("ParseSwaps of a short line = nil error, want one")
	}
	if got, err := ParseSwaps("Filename\tType\tSize\tUsed\tPriority\n"); err != nil || len(got) != 0 {
		t.Errorf("ParseSwaps of no swap = %v, %v; want none", got, err)
	}
}

func TestSpecValidate(t *testing.T) {
	for _, tc := range []struct {
		spec Spec
		ok   bool
	}{
		{Spec{Path: "/var/lib/dsec/swap", Size: 1 << 30}, true},
		{Spec{Path: "swap", Size: 1 << 30}, false},
		{Spec{Path: "/var/lib/../swap", Size: 1 << 30}, false},
		{Spec{Path: "/var/my swap", Size: 1 << 30}, false},
		{Spec{Path: "/var/swap", Size: 1 << 20}, false},
		{Spec{Path: "", Size: 1 << 30}, false},
	} {
		err := tc.spec.Validate()
		if (err == nil) != tc.ok || (err != nil && !errdefs.Is(err, errdefs.ErrInvalidArgument)) {
			t.Errorf("%+v.Validate() = %v, want ok %v (else InvalidArgument)", tc.spec, err, tc.ok)
		}
	}
}
