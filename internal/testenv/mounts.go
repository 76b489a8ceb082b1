package testenv

import (
	"bufio"
	"os"
	"strconv"
	"strings"
	"testing"
)

// MountsUnder lists the mount points at or under dir (from this process's
// mountinfo, with its escapes undone).
func MountsUnder(t testing.TB, dir string) []string {
	t.Helper()
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var got []string
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 4 {
			mp := unescapeMountinfo(fields[4])
			if mp == dir || strings.HasPrefix(mp, dir+"/") {
				got = append(got, mp)
			}
		}
	}
	return got
}

func unescapeMountinfo(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
