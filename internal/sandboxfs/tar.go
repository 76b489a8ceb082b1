package sandboxfs

// DefaultMaxEntries is the number of archive entries ExtractTar and
// ValidateTar accept when no limit is given.
const DefaultMaxEntries = 100_000

// DefaultMaxSize bounds the apparent size of the files one archive
// creates when no limit is given (ExtractOptions.MaxSize).
const DefaultMaxSize = 1 << 40

// DefaultReadDirLimit is the number of entries ReadDir returns when no limit
// is given.
const DefaultReadDirLimit = 10_000

// maxWalkDepth bounds how deep WriteTar and Remove walk: deeper directories
// are skipped (WriteTar) or refused (Remove). Each level holds a descriptor.
const maxWalkDepth = MaxPathLen / 2

// TarOptions say how (*Root).WriteTar writes an archive. The zero value
// records host ids and has no size limit.
type TarOptions struct {
	// MapID maps a file's host owner to the owner the archive records,
	// normally the ids the sandbox sees. Nil records host ids.
	MapID func(hostUID, hostGID uint32) (uid, gid uint32)
	// MaxBytes is the most file data the archive may carry; 0 means no
	// limit. Past it WriteTar stops with a ResourceExhausted error.
	MaxBytes int64
}

// ExtractOptions say how (*Root).ExtractTar unpacks an archive. The zero
// value extracts into an existing directory as host root, with no limit on
// the archive's size, DefaultMaxEntries entries and DefaultMaxSize bytes of
// files at most, spooling in os.TempDir().
type ExtractOptions struct {
	// UID and GID are the HOST ids that own everything created; the owners
	// the archive records are not trusted and are ignored. Negative ids are
	// refused.
	UID, GID int
	// MakeParents creates the destination and its missing parents, each
	// 0755 and owned by UID and GID. Without it the destination must be an
	// existing directory.
	MakeParents bool
	// MaxBytes is the largest archive, in bytes, accepted; 0 means no
	// limit. A larger one is a ResourceExhausted error and nothing is
	// written.
	MaxBytes int64
	// MaxEntries is the most entries the archive may have; 0 means
	// DefaultMaxEntries.
	MaxEntries int
	// MaxSize is the largest total apparent size, holes included, of the
	// files the archive creates; 0 means DefaultMaxSize. A sparse entry
	// makes a large file of a small archive: this bounds what it states.
	MaxSize int64
	// SpoolDir is the host directory the archive is spooled to (as an
	// unlinked file) before it is checked; "" means os.TempDir().
	SpoolDir string
	// LinksAnywhere accepts symbolic links whatever their targets (a copy
	// between sandboxes keeps links as they were): extraction never
	// follows the links it creates, and the archive still may not write
	// through its own links. Without it a link leading out of dest is
	// refused.
	LinksAnywhere bool
}

// TarStats counts an archive's entries. Files counts regular files and
// fifos; Links counts symbolic links and hard links; Bytes is the file data;
// Skipped counts what was left out (see WriteTar).
type TarStats struct {
	Files, Dirs, Links, Bytes, Skipped int64
}
