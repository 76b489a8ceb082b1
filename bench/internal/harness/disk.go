package harness

import "github.com/dsecproject/dsec/internal/ceiling"

// defaultDiskNeed is what a sandbox with the default writable disk
// (10 GiB) and exec output quota (256 MiB) takes in dsec's disk admission.
const defaultDiskNeed = 10<<30 + 256<<20

// DiskOvercommit is the --disk-overcommit that dsec up needs on the file
// system of dir for n sandboxes with default disks, with a quarter to
// spare: disks are admitted against the free space above the reserve ×
// that ratio. Benchmarks whose sandboxes write nothing pass it when it
// is above the default (32). 0 when the file system cannot be measured.
func DiskOvercommit(dir string, n int) float64 {
	sp, err := ceiling.DiskSpace(dir)
	if err != nil {
		return 0
	}
	left := max(sp.Free-ceiling.DiskReserve.Of(sp.Size), 1<<30)
	return float64(n) * defaultDiskNeed * 1.25 / float64(left)
}
