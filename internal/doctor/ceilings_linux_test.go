package doctor

import (
	"testing"

	"github.com/dsecproject/dsec/internal/ceiling"
)

func TestCeilingsResult(t *testing.T) {
	for _, tc := range []struct {
		call string
		h    ceiling.Host
		want want
	}{
		{"ceilingsResult(32768, 24G)", ceiling.Host{Tasks: 32768, MemoryBytes: 24 << 30}, want{OK, "at most 24576 of the host's 32768 tasks and 21.6 GiB", ""}},
		{"ceilingsResult(12000, 4G)", ceiling.Host{Tasks: 12000, MemoryBytes: 4 << 30}, want{Warn, "at most 7904 of the host's 12000 tasks", "kernel.pid_max"}},
	} {
		s, err := ceiling.ForSandboxes(tc.h, ceiling.Reserve{}, ceiling.Reserve{})
		if err != nil {
			t.Fatal(err)
		}
		tc.want.check(t, tc.call, ceilingsResult(tc.h, s))
	}
}
