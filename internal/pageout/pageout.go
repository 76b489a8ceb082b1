// Package pageout moves a process's memory out of RAM and back with
// process_madvise(2), from outside the process: MADV_PAGEOUT writes what it
// maps to swap (anonymous and shared memory) or drops it (clean page
// cache), and MADV_WILLNEED starts reading it back ahead of use. Resident
// reads which of its pages are in RAM (/proc/PID/pagemap), so that a later
// WillNeed brings back exactly those and nothing it had not touched.
//
// It is the mechanism of pausing a sandbox (docs/pause.md): the caller
// stops the process first (a frozen cgroup), so that its mappings hold
// still. What MADV_PAGEOUT cannot move it skips: pages locked in memory
// (mlock: the kernel refuses the whole mapping, which is skipped and the
// next one advised), pages shared with another process, special mappings.
//
// Invariants: a Process is named by a pidfd opened once, so a reused pid
// is never advised; every advice goes in calls of at most ChunkBytes, so
// that a context's end stops it within one call.
package pageout

// Range is the virtual addresses [Start, End) of a process, page aligned.
type Range struct {
	Start uint64 `json:"start"`
	End   uint64 `json:"end"`
}

// Len is the range's size in bytes.
func (r Range) Len() uint64 { return r.End - r.Start }

// Advice is what to do with a process's memory.
type Advice int

// The advice Advise gives.
const (
	// PageOut reclaims the pages: anonymous ones to swap (kept where no
	// swap is left), clean file pages dropped, dirty ones written.
	PageOut Advice = iota + 1
	// WillNeed starts reading the pages back: from swap into the swap
	// cache, file pages by readahead. It does not wait for the reads.
	WillNeed
)

func (a Advice) String() string {
	switch a {
	case PageOut:
		return "pageout"
	case WillNeed:
		return "willneed"
	}
	return "advice?"
}

// ChunkBytes bounds the memory one process_madvise call advises.
const ChunkBytes = 64 << 20

// maxRanges bounds the ranges Resident returns per process; past it,
// ranges closer than a growing gap are merged.
const maxRanges = 1 << 16

// mergeGap is the gap below which Resident merges two ranges: reading back
// a few pages that were not resident costs less than a longer list.
const mergeGap = 64 << 10

// Total is the bytes of ranges.
func Total(ranges []Range) uint64 {
	var n uint64
	for _, r := range ranges {
		n += r.Len()
	}
	return n
}

// coalesce merges sorted ranges that touch or are at most gap apart,
// widening gap until at most maxRanges are left.
func coalesce(rs []Range, gap uint64) []Range {
	for {
		out := rs[:0:0]
		for _, r := range rs {
			if n := len(out); n > 0 && r.Start <= out[n-1].End+gap {
				out[n-1].End = max(out[n-1].End, r.End)
				continue
			}
			out = append(out, r)
		}
		if len(out) <= maxRanges {
			return out
		}
		rs, gap = out, max(4*gap, 1<<20)
	}
}

// chunks splits ranges into batches of at most ChunkBytes and 1024
// ranges (the kernel's UIO_MAXIOV), splitting a range where it must.
func chunks(ranges []Range) [][]Range {
	const maxIov = 1024
	var out [][]Range
	var cur []Range
	var size uint64
	flush := func() {
		if len(cur) > 0 {
			out = append(out, cur)
			cur, size = nil, 0
		}
	}
	for _, r := range ranges {
		for r.Start < r.End {
			n := min(r.Len(), ChunkBytes-size)
			cur = append(cur, Range{r.Start, r.Start + n})
			size += n
			r.Start += n
			if size >= ChunkBytes || len(cur) == maxIov {
				flush()
			}
		}
	}
	flush()
	return out
}

// Split returns the first n bytes of ranges and the rest, splitting the
// range where n falls.
func Split(ranges []Range, n uint64) (head, rest []Range) {
	for i, r := range ranges {
		if n == 0 {
			return ranges[:i:i], ranges[i:]
		}
		if r.Len() > n {
			head = append(ranges[:i:i], Range{r.Start, r.Start + n})
			rest = append([]Range{{r.Start + n, r.End}}, ranges[i+1:]...)
			return head, rest
		}
		n -= r.Len()
	}
	return ranges, nil
}
