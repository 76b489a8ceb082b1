package dsec

import (
	"io"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// slowReader sleeps before each read, so every read is past the 200 ms
// reporting interval, as on a loaded machine.
type slowReader struct{ r io.Reader }

func (s slowReader) Read(b []byte) (int, error) {
	time.Sleep(210 * time.Millisecond)
	return s.r.Read(b)
}

func TestProgressReaderReportsTheEndOnce(t *testing.T) {
	for _, size := range []int{0, 5} {
		var got []int64
		p := &progressReader{r: slowReader{iotest.OneByteReader(strings.NewReader(strings.Repeat("x", size)))}, reported: -1,
			f: func(n int64) { got = append(got, n) }}
		if _, err := io.Copy(io.Discard, p); err != nil {
			t.Fatal(err)
		}
		ends := 0
		for _, n := range got {
			if n == int64(size) {
				ends++
			}
		}
		if ends != 1 {
			t.Errorf("size %d: reports %v, want the final count %d exactly once", size, got, size)
		}
	}
}
