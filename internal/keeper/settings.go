package keeper

import (
	"fmt"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/dsecproject/dsec/internal/ceiling"
	"github.com/dsecproject/dsec/internal/rootfs"
)

// Settings are the parts of a keeper's Config that the edge chooses (the
// flags of dsec up it passes on), in the form they have on the wire. The
// edge starts a keeper with them, and compares them with those of a keeper
// it finds running (Version.Settings): a keeper that runs with other
// settings than the edge asks for is never used silently (see Compare).
//
// Zero fields are the keeper's defaults; Normalize fills them in, so that
// "" and "dsec" compare equal as a cgroup parent.
type Settings struct {
	// Runtime is the OCI runtime, a name or a path; normalized, its path.
	Runtime string `json:"runtime,omitempty"`
	// CgroupParent holds every sandbox's cgroup (default "dsec").
	CgroupParent string `json:"cgroup_parent,omitempty"`
	// IDBase and IDSize are the first host id range (rootfs.Default),
	// IDRanges how many follow (DefaultUIDRanges, or as many as fit).
	IDBase   uint32 `json:"id_base,omitempty"`
	IDSize   uint32 `json:"id_size,omitempty"`
	IDRanges int    `json:"id_ranges,omitempty"`
	// HostPidsReserve and HostMemoryReserve, as ceiling.ParseReserve reads
	// them; "" is the default ("auto").
	HostPidsReserve   string `json:"host_pids_reserve,omitempty"`
	HostMemoryReserve string `json:"host_memory_reserve,omitempty"`
	// DiskQuota is auto (default), project, image or off.
	DiskQuota string `json:"disk_quota,omitempty"`
	// WarmPool is how many warm sandboxes are kept per shape (0: 2;
	// negative: none; normalized, -1 for none).
	WarmPool int `json:"warm_pool,omitempty"`
	// BlobSource, ChunkCache (default <state>/chunks), ChunkCacheSize and
	// ChunkSize (default 1 MiB) are the lazy layers' settings.
	BlobSource     string `json:"blob_source,omitempty"`
	ChunkCache     string `json:"chunk_cache,omitempty"`
	ChunkCacheSize int64  `json:"chunk_cache_size,omitempty"`
	ChunkSize      int64  `json:"chunk_size,omitempty"`
	// NetworkConfig is the operator's network config file (dsec up
	// --network-config; netpolicy.LoadCatalogue), "" for the built-in
	// catalogue alone. Protocol 5.
	NetworkConfig string `json:"network_config,omitempty"`
}

// DefaultChunkSize is the chunk size of lazy layers when none is set.
const DefaultChunkSize = 1 << 20

// Settings returns the settings part of c.
func (c Config) Settings() Settings {
	return Settings{
		Runtime: c.Runtime, CgroupParent: c.CgroupParent,
		IDBase: c.IDMap.HostID, IDSize: c.IDMap.Size, IDRanges: c.UIDRanges,
		HostPidsReserve: reserveString(c.HostPidsReserve), HostMemoryReserve: reserveString(c.HostMemoryReserve),
		DiskQuota: c.DiskQuota, WarmPool: c.WarmPool,
		BlobSource: c.BlobSource, ChunkCache: c.ChunkCache, ChunkCacheSize: c.ChunkCacheSize, ChunkSize: c.ChunkSize,
		NetworkConfig: c.NetworkConfig,
	}
}

// Apply sets the settings part of c to s.
func (s Settings) Apply(c *Config) error {
	pids, err := ceiling.ParseReserve(s.HostPidsReserve, false)
	if err != nil {
		return fmt.Errorf("host pids reserve: %w", err)
	}
	mem, err := ceiling.ParseReserve(s.HostMemoryReserve, true)
	if err != nil {
		return fmt.Errorf("host memory reserve: %w", err)
	}
	c.Runtime, c.CgroupParent = s.Runtime, s.CgroupParent
	c.IDMap, c.UIDRanges = rootfs.IDMap{HostID: s.IDBase, Size: s.IDSize}, s.IDRanges
	c.HostPidsReserve, c.HostMemoryReserve = pids, mem
	c.DiskQuota, c.WarmPool = s.DiskQuota, s.WarmPool
	c.BlobSource, c.ChunkCache, c.ChunkCacheSize, c.ChunkSize = s.BlobSource, s.ChunkCache, s.ChunkCacheSize, s.ChunkSize
	c.NetworkConfig = s.NetworkConfig
	return nil
}

func reserveString(r ceiling.Reserve) string {
	if r.IsZero() {
		return ""
	}
	return r.String()
}

// Normalize fills in the defaults of a keeper of stateDir, so that two
// settings that make the same keeper compare equal. It fails on settings
// no keeper can run with (a runtime that is not installed, id ranges that
// do not fit).
func (s Settings) Normalize(stateDir string) (Settings, error) {
	var err error
	if s.Runtime, err = FindRuntime(s.Runtime); err != nil {
		return s, err
	}
	if s.CgroupParent == "" {
		s.CgroupParent = "dsec"
	}
	if s.IDBase == 0 && s.IDSize == 0 {
		s.IDBase, s.IDSize = rootfs.Default.HostID, rootfs.Default.Size
	}
	most := maxUIDRanges(s.IDBase, s.IDSize)
	switch {
	case s.IDRanges > most:
		return s, fmt.Errorf("keeper: %d id ranges of %d ids from %d do not fit 32-bit ids (at most %d)", s.IDRanges, s.IDSize, s.IDBase, most)
	case s.IDRanges <= 0:
		s.IDRanges = min(DefaultUIDRanges, most)
		if s.IDRanges == 0 {
			return s, fmt.Errorf("keeper: id range %d+%d does not fit 32-bit ids", s.IDBase, s.IDSize)
		}
	}
	for _, r := range []*string{&s.HostPidsReserve, &s.HostMemoryReserve} {
		if *r == "auto" {
			*r = ""
		}
	}
	if s.DiskQuota == "" {
		s.DiskQuota = "auto"
	}
	switch {
	case s.WarmPool == 0:
		s.WarmPool = 2
	case s.WarmPool < 0:
		s.WarmPool = -1
	}
	if s.ChunkCache == "" {
		s.ChunkCache = filepath.Join(stateDir, "chunks")
	}
	if s.ChunkSize == 0 {
		s.ChunkSize = DefaultChunkSize
	}
	return s, nil
}

// Args are the flags of `dsec keeper` that start a keeper with s.
func (s Settings) Args() []string {
	var args []string
	add := func(name, v string) {
		if v != "" && v != "0" {
			args = append(args, "--"+name, v)
		}
	}
	add("uid-base", strconv.FormatUint(uint64(s.IDBase), 10))
	add("uid-count", strconv.FormatUint(uint64(s.IDSize), 10))
	add("uid-ranges", strconv.Itoa(s.IDRanges))
	add("runtime", s.Runtime)
	add("cgroup-parent", s.CgroupParent)
	add("host-pids-reserve", s.HostPidsReserve)
	add("host-memory-reserve", s.HostMemoryReserve)
	add("disk-quota", s.DiskQuota)
	add("warm-pool", strconv.Itoa(s.WarmPool))
	add("blob-source", s.BlobSource)
	add("chunk-cache", s.ChunkCache)
	add("chunk-cache-size", strconv.FormatInt(s.ChunkCacheSize, 10))
	add("chunk-size", strconv.FormatInt(s.ChunkSize, 10))
	add("network-config", s.NetworkConfig)
	return args
}

// SettingsFromArgs reads the settings back from the arguments of a
// `dsec keeper` command line (after "keeper"): how the settings of a
// protocol 2 keeper, which does not report them, are learnt from its
// /proc/PID/cmdline. The flags are those Args writes, which every dsec
// so far has passed as "--name value"; --state-dir is skipped.
func SettingsFromArgs(args []string) (Settings, error) {
	var s Settings
	for i := 0; i < len(args); i++ {
		name, val, inline := strings.Cut(strings.TrimPrefix(args[i], "--"), "=")
		if !strings.HasPrefix(args[i], "--") {
			return s, fmt.Errorf("keeper argument %q: not a flag", args[i])
		}
		if !inline {
			if i+1 >= len(args) {
				return s, fmt.Errorf("keeper flag --%s: no value", name)
			}
			i++
			val = args[i]
		}
		var err error
		atoi := func(p *int) { *p, err = strconv.Atoi(val) }
		atoi64 := func(p *int64) { *p, err = strconv.ParseInt(val, 10, 64) }
		atou32 := func(p *uint32) {
			var v uint64
			v, err = strconv.ParseUint(val, 10, 32)
			*p = uint32(v)
		}
		switch name {
		case "state-dir":
		case "uid-base":
			atou32(&s.IDBase)
		case "uid-count":
			atou32(&s.IDSize)
		case "uid-ranges":
			atoi(&s.IDRanges)
		case "runtime":
			s.Runtime = val
		case "cgroup-parent":
			s.CgroupParent = val
		case "host-pids-reserve":
			s.HostPidsReserve = val
		case "host-memory-reserve":
			s.HostMemoryReserve = val
		case "disk-quota":
			s.DiskQuota = val
		case "warm-pool":
			atoi(&s.WarmPool)
		case "blob-source":
			s.BlobSource = val
		case "chunk-cache":
			s.ChunkCache = val
		case "chunk-cache-size":
			atoi64(&s.ChunkCacheSize)
		case "chunk-size":
			atoi64(&s.ChunkSize)
		case "network-config":
			s.NetworkConfig = val
		default:
			return s, fmt.Errorf("keeper flag --%s: unknown", name)
		}
		if err != nil {
			return s, fmt.Errorf("keeper flag --%s %q: %w", name, val, err)
		}
	}
	return s, nil
}

// Change is one setting in which a running keeper differs from what the
// edge asks for.
type Change struct {
	// Flag is dsec up's flag of the setting.
	Flag string
	// Have is the keeper's value, Want the edge's (normalized).
	Have, Want string
	// Class says what it takes to change it.
	Class ChangeClass
}

// ChangeClass says what it takes to change a setting of a running keeper.
type ChangeClass int

const (
	// Live settings are changed in the running keeper (POST /v1/settings).
	Live ChangeClass = iota
	// Restart settings take a new keeper, which adopts the sandboxes of
	// the old one: they do not change what a running sandbox is.
	Restart
	// Fixed settings are part of what every sandbox is (its cgroup, its
	// host ids, its runtime state, its disk): they change only while the
	// keeper holds no sandboxes.
	Fixed
)

func (c ChangeClass) String() string {
	switch c {
	case Live:
		return "live"
	case Restart:
		return "restart"
	}
	return "fixed"
}

// Compare lists how have (a running keeper's settings) differs from want
// (the edge's), both normalized, in the order of the fields.
func Compare(have, want Settings) []Change {
	var out []Change
	diff := func(flag, h, w string, class ChangeClass) {
		if h != w {
			out = append(out, Change{Flag: flag, Have: h, Want: w, Class: class})
		}
	}
	itoa := func(v int64) string { return strconv.FormatInt(v, 10) }
	diff("--runtime", have.Runtime, want.Runtime, Fixed)
	diff("--cgroup-parent", have.CgroupParent, want.CgroupParent, Fixed)
	diff("--uid-base", itoa(int64(have.IDBase)), itoa(int64(want.IDBase)), Fixed)
	diff("--uid-count", itoa(int64(have.IDSize)), itoa(int64(want.IDSize)), Fixed)
	// More ranges are held as before; fewer would not hold sandboxes in
	// the ranges dropped, and hand their ids out again.
	ranges := Restart
	if want.IDRanges < have.IDRanges {
		ranges = Fixed
	}
	diff("--uid-ranges", itoa(int64(have.IDRanges)), itoa(int64(want.IDRanges)), ranges)
	diff("--host-pids-reserve", orAuto(have.HostPidsReserve), orAuto(want.HostPidsReserve), Restart)
	diff("--host-memory-reserve", orAuto(have.HostMemoryReserve), orAuto(want.HostMemoryReserve), Restart)
	diff("--disk-quota", have.DiskQuota, want.DiskQuota, Fixed)
	diff("--warm-pool", itoa(int64(have.WarmPool)), itoa(int64(want.WarmPool)), Live)
	diff("--blob-source", have.BlobSource, want.BlobSource, Restart)
	diff("--chunk-cache", have.ChunkCache, want.ChunkCache, Restart)
	diff("--chunk-cache-size", itoa(have.ChunkCacheSize), itoa(want.ChunkCacheSize), Restart)
	diff("--chunk-size", itoa(have.ChunkSize), itoa(want.ChunkSize), Restart)
	// A new keeper reads the file and restores every policy against it.
	diff("--network-config", have.NetworkConfig, want.NetworkConfig, Restart)
	return out
}

func orAuto(s string) string {
	if s == "" {
		return "auto"
	}
	return s
}

// Worst returns the highest class among changes (Live for none).
func Worst(changes []Change) ChangeClass {
	c := Live
	for _, ch := range changes {
		c = max(c, ch.Class)
	}
	return c
}

// Describe lists changes as "--flag have → want" for messages.
func Describe(changes []Change) string {
	parts := make([]string, 0, len(changes))
	for _, c := range changes {
		parts = append(parts, fmt.Sprintf("%s %s (asked: %s)", c.Flag, c.Have, c.Want))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}
