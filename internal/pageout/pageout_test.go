package pageout

import (
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestParseMaps(t *testing.T) {
	maps := `55d0c0000000-55d0c0021000 r--p 00000000 fd:00 123 /bin/busybox
55d0c0021000-55d0c0100000 r-xp 00021000 fd:00 123 /bin/busybox
7f0000000000-7f0004000000 ---p 00000000 00:00 0
7f0004000000-7f0008000000 rw-p 00000000 00:00 0 
7ffd1000000-7ffd1021000 rw-p 00000000 00:00 0                          [stack]
7ffd10fe0000-7ffd10fe4000 r--p 00000000 00:00 0                          [vvar]
7ffd10fe4000-7ffd10fe6000 r-xp 00000000 00:00 0                          [vdso]
ffffffffff600000-ffffffffff601000 --xp 00000000 00:00 0                  [vsyscall]
`
	got, err := parseMaps([]byte(maps))
	if err != nil {
		t.Fatal(err)
	}
	want := []Range{
		{0x55d0c0000000, 0x55d0c0021000},
		{0x55d0c0021000, 0x55d0c0100000},
		{0x7f0004000000, 0x7f0008000000},
		{0x7ffd1000000, 0x7ffd1021000},
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("parseMaps (-want +got):\n%s", diff)
	}
	if _, err := parseMaps([]byte("zz-10 rw-p 0 00:00 0\n")); err == nil {
		t.Errorf("parseMaps of a bad address = nil error, want one")
	}
}

func TestCoalesce(t *testing.T) {
	page := uint64(4096)
	in := []Range{{0, page}, {page, 2 * page}, {4 * page, 5 * page}, {100 * page, 101 * page}}
	got := coalesce(in, 4*page)
	want := []Range{{0, 5 * page}, {100 * page, 101 * page}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("coalesce (-want +got):\n%s", diff)
	}
	// Past maxRanges the gap grows until they fit.
	many := make([]Range, 0, 3*maxRanges)
	for i := range uint64(3 * maxRanges) {
		many = append(many, Range{i * 2 * page, i*2*page + page})
	}
	if got := coalesce(many, 0); len(got) > maxRanges || got[0].Start != 0 || got[len(got)-1].End != many[len(many)-1].End {
		t.Errorf("coalesce of %d ranges = %d ranges from %#x to %#x", len(many), len(got), got[0].Start, got[len(got)-1].End)
	}
}

func TestChunks(t *testing.T) {
	in := []Range{{0, ChunkBytes + 4096}, {1 << 40, 1<<40 + 4096}}
	got := chunks(in)
	want := [][]Range{{{0, ChunkBytes}}, {{ChunkBytes, ChunkBytes + 4096}, {1 << 40, 1<<40 + 4096}}}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("chunks (-want +got):\n%s", diff)
	}
	var small []Range
	for i := range uint64(1500) {
		small = append(small, Range{i << 20, i<<20 + 4096})
	}
	if got := chunks(small); len(got) != 2 || len(got[0]) != 1024 || len(got[1]) != 476 {
		t.Errorf("chunks of 1500 ranges: %d chunks", len(got))
	}
}

func TestSkipRefused(t *testing.T) {
	c := []Range{{0, 10}, {10, 30}, {30, 40}}
	for _, tc := range []struct {
		n    uint64
		want []Range
	}{
		{0, []Range{{10, 30}, {30, 40}}},
		{10, []Range{{30, 40}}},
		{15, []Range{{30, 40}}},
		{30, []Range{}},
	} {
		got := skipRefused(c, tc.n)
		if diff := cmp.Diff(tc.want, got, cmpEmpty); diff != "" {
			t.Errorf("skipRefused(%d) (-want +got):\n%s", tc.n, diff)
		}
	}
}

var cmpEmpty = cmp.Comparer(func(a, b []Range) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
})

func TestSplit(t *testing.T) {
	in := []Range{{0, 10}, {20, 30}}
	for _, tc := range []struct {
		n          uint64
		head, rest []Range
	}{
		{0, nil, in},
		{5, []Range{{0, 5}}, []Range{{5, 10}, {20, 30}}},
		{10, []Range{{0, 10}}, []Range{{20, 30}}},
		{15, []Range{{0, 10}, {20, 25}}, []Range{{25, 30}}},
		{20, in, nil},
		{99, in, nil},
	} {
		head, rest := Split(in, tc.n)
		if diff := cmp.Diff(tc.head, head, cmpEmpty); diff != "" {
			t.Errorf("Split(%d) head (-want +got):\n%s", tc.n, diff)
		}
		if diff := cmp.Diff(tc.rest, rest, cmpEmpty); diff != "" {
			t.Errorf("Split(%d) rest (-want +got):\n%s", tc.n, diff)
		}
	}
	if in[0] != (Range{0, 10}) || in[1] != (Range{20, 30}) {
		t.Errorf("Split changed its input: %v", in)
	}
}
