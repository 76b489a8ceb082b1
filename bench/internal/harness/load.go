package harness

import (
	"os"
	"strings"
)

// LoadAvg returns /proc/loadavg's three averages (1, 5 and 15 minutes),
// nil when it cannot be read: benchmarks report them before and after.
func LoadAvg() []string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return nil
	}
	f := strings.Fields(string(b))
	return f[:min(3, len(f))]
}
