// Package rootfs builds a container sandbox's root file system: each
// read-only EROFS layer is mounted once per node from its image file (a
// file-backed mount through mount(2), no loop device), then given an
// idmapped view for the sandboxes' shared uid range; a sandbox's root is an
// overlayfs over those views with its own upper directory on local disk.
//
// Invariants: a layer stays mounted while a sandbox uses it (reference
// counted by Layers) and is unmounted when the last one releases it; all
// mount points live under the directory given to NewLayers, whose names are
// derived from digests so that a restarted process finds and removes them.
package rootfs

import (
	"fmt"
	"strings"
)

// IDMap is the host id range sandbox ids 0..Size-1 map to.
type IDMap struct {
	HostID uint32
	Size   uint32
}

// Default is the shared range: a high host uid/gid range that no ordinary
// account uses.
var Default = IDMap{HostID: 1_000_000_000, Size: 65536}

// Validate checks the range fits in 32 bits and is not the host's own ids.
func (m IDMap) Validate() error {
	if m.Size == 0 || m.HostID == 0 {
		return fmt.Errorf("uid range %d+%d: must start above 0 and have a size", m.HostID, m.Size)
	}
	if uint64(m.HostID)+uint64(m.Size) > 1<<32-1 {
		return fmt.Errorf("uid range %d+%d: exceeds 32-bit ids", m.HostID, m.Size)
	}
	return nil
}

// ToHost maps an id inside the sandbox to the host id; ok is false outside
// the range.
func (m IDMap) ToHost(id uint32) (uint32, bool) {
	if id >= m.Size {
		return 0, false
	}
	return m.HostID + id, true
}

// FromHost maps a host id to the id seen inside; ids outside the range show
// as the overflow id 65534, as the kernel shows them.
func (m IDMap) FromHost(id uint32) uint32 {
	if id >= m.HostID && id-m.HostID < m.Size {
		return id - m.HostID
	}
	return 65534
}

// shortName is the mount directory name of a layer: the digest's first 16
// hex digits, enough to be unique on a node and short enough to keep
// overlay's lowerdir option under the page-size limit for dozens of layers.
func shortName(digest string) (string, error) {
	hex, ok := strings.CutPrefix(digest, "sha256:")
	if !ok || len(hex) != 64 {
		return "", fmt.Errorf("layer digest %q: want sha256:<64 hex>", digest)
	}
	for _, c := range hex {
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return "", fmt.Errorf("layer digest %q: want lowercase hex", digest)
		}
	}
	return hex[:16], nil
}
