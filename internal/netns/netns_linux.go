package netns

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	vnetns "github.com/vishvananda/netns"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

const (
	// routerFile is the router namespace's file in the caller's dir.
	routerFile = "router"
	// namePrefix starts every router-side link name: "dsr" and 12 hex
	// digits, 15 bytes, the most IFNAMSIZ allows.
	namePrefix = "dsr"
	// aliasPrefix starts every router-side link's alias; the ID follows.
	aliasPrefix = "dsec:"
	// MaxIDLen bounds an ID so that its alias fits IFALIASZ (256).
	MaxIDLen = 200
	// nameTries is how many names Attach tries for one ID when another
	// link holds the name its hash gives.
	nameTries = 8
	// LinkMTU is both ends' MTU. Nothing a sandbox sends is forwarded: its
	// TCP ends at the proxy and its DNS at the resolver, both in the
	// router namespace, so its link never meets a NIC's MTU and can carry
	// 64 KiB segments as loopback does. With 1,500 bytes the veth moved a
	// third to a half less through the proxy (docs/network.md, "Cost").
	LinkMTU = 65520
)

// Router is a node's router namespace and the sandboxes' links in it.
// Its methods are safe for concurrent use.
type Router struct {
	path string
	pool netip.Prefix
	// slots is the number of /31 pairs in pool.
	slots uint32

	// inflight counts Detach calls removing a link outside mu; Close and
	// Destroy wait for them before closing ns and h.
	inflight sync.WaitGroup

	mu sync.Mutex
	// The fields below are guarded by mu; ns and h are not changed while
	// open, and may be used without mu once taken under it.
	ns     vnetns.NsHandle
	h      *netlink.Handle
	closed bool
	links  map[string]*record // by ID
	names  map[string]string  // router-side name -> ID
	used   map[uint32]string  // slot -> ID
	next   uint32             // where the search for a free slot starts
}

type record struct {
	slot uint32
	name string
	// detaching is set while Detach removes the link; the slot stays
	// taken until it is gone.
	detaching bool
}

// Open creates the router namespace as dir/router, or reopens the one there
// after a restart or a crash: links it can account for (a veth whose alias
// names a sandbox and whose address is a free slot of pool) are adopted,
// every other link in the namespace is removed. The zero pool means
// DefaultPool; a pool is IPv4, from /8 to /31.
func Open(dir string, pool netip.Prefix) (*Router, error) {
	if !pool.IsValid() {
		pool = DefaultPool
	}
	if !pool.Addr().Is4() || pool.Bits() < 8 || pool.Bits() > 31 || pool.Masked() != pool {
		return nil, fmt.Errorf("network pool %s: use an IPv4 network from /8 to /31, such as %s: %w",
			pool, DefaultPool, errdefs.ErrInvalidArgument)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("make router namespace dir: %w", err)
	}
	path := filepath.Join(dir, routerFile)
	isNS, err := isNSMount(path)
	if err != nil {
		return nil, err
	}
	if !isNS {
		// A file left by a crash between creating and mounting it.
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("remove stale router namespace file: %w", err)
		}
		if err := createNS(path); err != nil {
			return nil, fmt.Errorf("create router namespace: %w", err)
		}
	}
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return nil, fmt.Errorf("open router namespace: %w", err)
	}
	r := &Router{
		path:  path,
		pool:  pool,
		slots: uint32(1) << (31 - pool.Bits()),
		ns:    ns,
		links: make(map[string]*record),
		names: make(map[string]string),
		used:  make(map[uint32]string),
	}
	if err := r.setup(); err != nil {
		if r.h != nil {
			r.h.Close()
		}
		ns.Close()
		return nil, err
	}
	return r, nil
}

func (r *Router) setup() error {
	h, err := netlink.NewHandleAt(r.ns)
	if err != nil {
		return fmt.Errorf("netlink in router namespace: %w", err)
	}
	r.h = h
	// Forwarding stays off and the source of every packet must match the
	// link it came in on. These are the router namespace's own sysctls.
	if err := inNS(r.ns, func() error {
		for file, v := range map[string]string{
			"ipv4/ip_forward":             "0",
			"ipv4/conf/all/forwarding":    "0",
			"ipv4/conf/all/rp_filter":     "1",
			"ipv4/conf/default/rp_filter": "1",
			// IPv4 only for now: router ends take no IPv6 at all.
			"ipv6/conf/all/forwarding":       "0",
			"ipv6/conf/default/disable_ipv6": "1",
		} {
			if err := os.WriteFile("/proc/sys/net/"+file, []byte(v), 0); err != nil {
				return err
			}
		}
		return nil
	}); err != nil {
		return fmt.Errorf("set router namespace sysctls: %w", err)
	}
	if err := linkUp(h, "lo"); err != nil {
		return fmt.Errorf("router namespace: %w", err)
	}
	_, err = r.resync()
	return err
}

// resync makes the records match the router namespace's links: it adopts
// links it can account for, removes the others, and forgets records whose
// link went away (a sandbox namespace that died takes its pair with it).
// It returns the IDs whose links it removed. r.mu must be held, or r not
// yet shared.
func (r *Router) resync() ([]string, error) {
	all, err := r.h.LinkList()
	if err != nil {
		return nil, fmt.Errorf("list router links: %w", err)
	}
	present := make(map[string]bool)
	var removed []string
	for _, l := range all {
		a := l.Attrs()
		if a.Name == "lo" {
			continue
		}
		id, slot, ok := r.account(l)
		if ok {
			if rec, known := r.links[id]; known && rec.name == a.Name && rec.slot == slot {
				present[id] = true
				continue
			}
			if _, known := r.links[id]; !known && r.used[slot] == "" {
				r.add(id, &record{slot: slot, name: a.Name})
				present[id] = true
				continue
			}
		}
		if err := r.h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return removed, fmt.Errorf("remove leftover link %s: %w", a.Name, err)
		}
		if ok {
			removed = append(removed, id)
		}
	}
	for id := range r.links {
		if !present[id] {
			r.forget(id)
		}
	}
	return removed, nil
}

// account reports the sandbox and slot a router-side link belongs to.
func (r *Router) account(l netlink.Link) (id string, slot uint32, ok bool) {
	a := l.Attrs()
	if _, veth := l.(*netlink.Veth); !veth || !strings.HasPrefix(a.Name, namePrefix) {
		return "", 0, false
	}
	id, ok = strings.CutPrefix(a.Alias, aliasPrefix)
	if !ok || validID(id) != nil {
		return "", 0, false
	}
	addrs, err := r.h.AddrList(l, netlink.FAMILY_V4)
	if err != nil || len(addrs) != 1 {
		return "", 0, false
	}
	ones, _ := addrs[0].Mask.Size()
	ip, _ := netip.AddrFromSlice(addrs[0].IP.To4())
	if ones != 31 || !r.pool.Contains(ip) {
		return "", 0, false
	}
	off := u32(ip) - u32(r.pool.Addr())
	if off%2 != 0 {
		return "", 0, false
	}
	return id, off / 2, true
}

func (r *Router) add(id string, rec *record) {
	r.links[id] = rec
	r.names[rec.name] = id
	r.used[rec.slot] = id
}

func (r *Router) forget(id string) {
	rec, ok := r.links[id]
	if !ok {
		return
	}
	delete(r.links, id)
	delete(r.names, rec.name)
	delete(r.used, rec.slot)
}

// Attach links the sandbox id, whose network namespace is the file
// sandboxNS (a bind mount or /proc/PID/ns/net), to the router: a veth pair
// with eth0 in the sandbox, addresses from the pool, and a default route
// via the router end. It brings lo up in the sandbox too.
func (r *Router) Attach(id, sandboxNS string) (Link, error) {
	if err := validID(id); err != nil {
		return Link{}, err
	}
	sb, err := openNetNS(sandboxNS)
	if err != nil {
		return Link{}, fmt.Errorf("sandbox %s: %w", id, err)
	}
	defer sb.Close()
	return r.attach(id, sb)
}

// AttachFd is Attach for a namespace given as an open file descriptor (of
// /proc/PID/ns/net, say, opened while the sandbox's init was known to be
// PID), which is safer than a path that can be reused. It does not close fd.
func (r *Router) AttachFd(id string, fd int) (Link, error) {
	if err := validID(id); err != nil {
		return Link{}, err
	}
	sb, err := unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0)
	if err != nil {
		return Link{}, fmt.Errorf("sandbox %s: network namespace fd: %w", id, errdefs.ErrInvalidArgument)
	}
	ns := vnetns.NsHandle(sb)
	defer ns.Close()
	if t, err := unix.IoctlRetInt(sb, unix.NS_GET_NSTYPE); err != nil || t != unix.CLONE_NEWNET {
		return Link{}, fmt.Errorf("sandbox %s: fd %d is not a network namespace: %w", id, fd, errdefs.ErrInvalidArgument)
	}
	return r.attach(id, ns)
}

func (r *Router) attach(id string, sb vnetns.NsHandle) (Link, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return Link{}, fmt.Errorf("attach sandbox %s: the node's network router is closed: %w", id, errdefs.ErrUnavailable)
	}
	if same, err := sameNS(sb, r.ns); err != nil || same {
		return Link{}, fmt.Errorf("attach sandbox %s: its namespace is the router's: %w", id, errdefs.ErrInvalidArgument)
	}
	// The calling thread's namespace is the host's: threads change
	// namespace only in inNS and createNS, which discard them. (Not
	// /proc/self: when such a thread is the main one, Go parks it rather
	// than ending it, and the process's namespace then reads as that one.)
	runtime.LockOSThread()
	host, err := vnetns.GetFromPath("/proc/thread-self/ns/net")
	runtime.UnlockOSThread()
	if err != nil {
		return Link{}, fmt.Errorf("attach sandbox %s: open the host's network namespace: %w", id, err)
	}
	same, err := sameNS(sb, host)
	host.Close()
	if err != nil || same {
		return Link{}, fmt.Errorf("attach sandbox %s: its namespace is the host's: %w", id, errdefs.ErrInvalidArgument)
	}
	if rec, ok := r.links[id]; ok {
		if _, err := r.h.LinkByName(rec.name); err == nil {
			return Link{}, fmt.Errorf("sandbox %s already has a network link: %w", id, errdefs.ErrAlreadyExists)
		}
		r.forget(id) // its namespace died and took the pair with it
	}
	slot, ok := r.freeSlot()
	if !ok {
		// Records of sandboxes whose namespaces died may hold slots.
		if _, err := r.resync(); err != nil {
			return Link{}, fmt.Errorf("attach sandbox %s: %w", id, err)
		}
		slot, ok = r.freeSlot()
	}
	if !ok {
		return Link{}, fmt.Errorf("attach sandbox %s: all %d network links of this node are in use: delete sandboxes with network or give the node a larger pool: %w",
			id, r.slots, errdefs.ErrResourceExhausted)
	}
	l := r.link(id, "", slot)

	var veth *netlink.Veth
	for n := 0; n < nameTries; n++ {
		name := linkName(id, n)
		if _, taken := r.names[name]; taken {
			continue
		}
		veth = &netlink.Veth{
			LinkAttrs:     netlink.LinkAttrs{Name: name, MTU: LinkMTU},
			PeerName:      SandboxIfName,
			PeerMTU:       LinkMTU,
			PeerNamespace: netlink.NsFd(int(sb)),
		}
		err = r.h.LinkAdd(veth)
		if err == nil {
			l.RouterName = name
			break
		}
		veth = nil
		if !errors.Is(err, unix.EEXIST) {
			break
		}
		// Either name is taken: ours by a link we do not know, or the
		// sandbox's eth0.
		if _, err2 := r.h.LinkByName(name); err2 != nil {
			return Link{}, fmt.Errorf("attach sandbox %s: its namespace already has a link named %s: %w",
				id, SandboxIfName, errdefs.ErrFailedPrecondition)
		}
	}
	if veth == nil {
		return Link{}, fmt.Errorf("attach sandbox %s: add link: %w", id, err)
	}
	if err := r.configure(l, sb); err != nil {
		if err2 := r.h.LinkDel(veth); err2 != nil && !errors.Is(err2, unix.ENODEV) {
			err = errors.Join(err, fmt.Errorf("remove link: %w", err2))
		}
		return Link{}, fmt.Errorf("attach sandbox %s: %w", id, err)
	}
	r.add(id, &record{slot: slot, name: l.RouterName})
	r.next = slot + 1
	return l, nil
}

// configure addresses both ends and routes the sandbox through the router.
func (r *Router) configure(l Link, sb vnetns.NsHandle) error {
	mask := net.CIDRMask(31, 32)
	rl, err := r.h.LinkByName(l.RouterName)
	if err != nil {
		return fmt.Errorf("find router end: %w", err)
	}
	// The kernel takes no alias when it creates a link. Until it has one,
	// Open counts the link as a leftover.
	if err := r.h.LinkSetAlias(rl, aliasPrefix+l.ID); err != nil {
		return fmt.Errorf("router end: set alias: %w", err)
	}
	if err := r.h.AddrAdd(rl, &netlink.Addr{IPNet: &net.IPNet{IP: l.RouterAddr.AsSlice(), Mask: mask}}); err != nil {
		return fmt.Errorf("router end: add address: %w", err)
	}
	if err := r.h.LinkSetUp(rl); err != nil {
		return fmt.Errorf("router end: up: %w", err)
	}

	sh, err := netlink.NewHandleAt(sb)
	if err != nil {
		return fmt.Errorf("netlink in sandbox namespace: %w", err)
	}
	defer sh.Close()
	if err := linkUp(sh, "lo"); err != nil {
		return fmt.Errorf("sandbox: %w", err)
	}
	sl, err := sh.LinkByName(SandboxIfName)
	if err != nil {
		return fmt.Errorf("find sandbox end: %w", err)
	}
	// No IPv6 link-local address in the sandbox: IPv4 only for now (the
	// router end has IPv6 disabled).
	if err := sh.LinkSetIP6AddrGenMode(sl, nl.IN6_ADDR_GEN_MODE_NONE); err != nil {
		return fmt.Errorf("sandbox end: disable IPv6 addresses: %w", err)
	}
	if err := sh.AddrAdd(sl, &netlink.Addr{IPNet: &net.IPNet{IP: l.SandboxAddr.AsSlice(), Mask: mask}}); err != nil {
		return fmt.Errorf("sandbox end: add address: %w", err)
	}
	if err := sh.LinkSetUp(sl); err != nil {
		return fmt.Errorf("sandbox end: up: %w", err)
	}
	if err := sh.RouteAdd(&netlink.Route{LinkIndex: sl.Attrs().Index, Gw: l.RouterAddr.AsSlice()}); err != nil {
		return fmt.Errorf("sandbox end: default route: %w", err)
	}
	return nil
}

// freeSlot finds a free slot, starting after the last one given, so that a
// detached sandbox's addresses are not reused at once. r.mu must be held.
func (r *Router) freeSlot() (uint32, bool) {
	if uint32(len(r.used)) >= r.slots {
		return 0, false
	}
	for i := uint32(0); i < r.slots; i++ {
		s := (r.next + i) % r.slots
		if r.used[s] == "" {
			return s, true
		}
	}
	return 0, false
}

func (r *Router) link(id, name string, slot uint32) Link {
	base := u32(r.pool.Addr()) + 2*slot
	return Link{ID: id, RouterName: name, RouterAddr: addr4(base), SandboxAddr: addr4(base + 1)}
}

// Detach removes the sandbox's link, both ends. Detaching a sandbox that
// has no link is not an error. The kernel takes some 20 ms to remove a link
// (it waits for an RCU grace period), so Detach does it on a handle of its
// own without holding r's lock: concurrent Detach calls overlap.
func (r *Router) Detach(id string) error {
	r.mu.Lock()
	rec, ok := r.links[id]
	if !ok || r.closed || rec.detaching {
		r.mu.Unlock()
		return nil
	}
	rec.detaching = true
	ns := r.ns
	r.inflight.Add(1)
	r.mu.Unlock()
	defer r.inflight.Done()

	h, err := netlink.NewHandleAt(ns)
	if err == nil {
		err = delLink(h, rec.name)
		h.Close()
	}

	r.mu.Lock()
	defer r.mu.Unlock()
	if err != nil {
		rec.detaching = false
		return fmt.Errorf("detach sandbox %s: %w", id, err)
	}
	if r.links[id] == rec {
		r.forget(id)
	}
	return nil
}

// Link returns sandbox id's link.
func (r *Router) Link(id string) (Link, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec, ok := r.links[id]
	if !ok {
		return Link{}, false
	}
	return r.link(id, rec.name, rec.slot), true
}

// Count returns how many links the router has.
func (r *Router) Count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.links)
}

// Links returns the links attached now, ordered by router address.
func (r *Router) Links() []Link {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]Link, 0, len(r.links))
	for id, rec := range r.links {
		out = append(out, r.link(id, rec.name, rec.slot))
	}
	slices.SortFunc(out, func(a, b Link) int { return a.RouterAddr.Compare(b.RouterAddr) })
	return out
}

// Sweep removes the links of sandboxes keep does not keep, and any link in
// the router namespace it cannot account for, and returns the IDs whose
// links it removed. keep is called with r's lock held: it must not call r.
func (r *Router) Sweep(keep func(id string) bool) ([]string, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, fmt.Errorf("sweep: the node's network router is closed: %w", errdefs.ErrUnavailable)
	}
	removed, err := r.resync()
	if err != nil {
		return removed, err
	}
	for id, rec := range r.links {
		if keep(id) {
			continue
		}
		if err := delLink(r.h, rec.name); err != nil {
			return removed, fmt.Errorf("sweep sandbox %s: %w", id, err)
		}
		r.forget(id)
		removed = append(removed, id)
	}
	slices.Sort(removed)
	return removed, nil
}

// Close releases r's handles; the namespace and its links stay, for the
// next Open.
func (r *Router) Close() error {
	if r.shut() {
		r.h.Close()
		r.ns.Close()
	}
	return nil
}

// shut marks r closed and waits for Detach calls in flight. It reports
// whether r was open.
func (r *Router) shut() bool {
	r.mu.Lock()
	was := !r.closed
	r.closed = true
	r.mu.Unlock()
	r.inflight.Wait()
	return was && r.h != nil
}

// Destroy removes every link in the router namespace, then the namespace
// itself and its file. It is for purge and for tearing a node down.
func (r *Router) Destroy() error {
	if !r.shut() {
		return fmt.Errorf("destroy: the node's network router is closed: open it again: %w", errdefs.ErrFailedPrecondition)
	}
	defer r.ns.Close()
	defer r.h.Close()
	all, err := r.h.LinkList()
	if err != nil {
		return fmt.Errorf("destroy: list router links: %w", err)
	}
	for _, l := range all {
		if l.Attrs().Name == "lo" {
			continue
		}
		// Removing the router end removes the sandbox end with it, at
		// once, rather than when the kernel gets round to the namespace.
		if err := r.h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
			return fmt.Errorf("destroy: remove link %s: %w", l.Attrs().Name, err)
		}
	}
	r.mu.Lock()
	for id := range r.links {
		r.forget(id)
	}
	r.mu.Unlock()
	if err := unix.Unmount(r.path, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("destroy: unmount router namespace: %w", err)
	}
	if err := os.Remove(r.path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("destroy: remove router namespace file: %w", err)
	}
	return nil
}

// Remove destroys the router namespace in dir, if there is one, with every
// link in it; unlike Open it creates nothing. It is for dsec purge.
func Remove(dir string) error {
	path := filepath.Join(dir, routerFile)
	isNS, err := isNSMount(path)
	if err != nil {
		return err
	}
	if !isNS {
		if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("remove stale router namespace file: %w", err)
		}
		return nil
	}
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return fmt.Errorf("open router namespace: %w", err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		ns.Close()
		return fmt.Errorf("netlink in router namespace: %w", err)
	}
	r := &Router{path: path, ns: ns, h: h, links: map[string]*record{}, names: map[string]string{}, used: map[uint32]string{}}
	return r.Destroy()
}

// linkName is the router-side name for id: the prefix and 12 hex digits of
// a hash of id and n, so that IDs of any length give names within IFNAMSIZ.
func linkName(id string, n int) string {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(n))
	sum := sha256.Sum256(append(b[:], id...))
	return namePrefix + hex.EncodeToString(sum[:6])
}

func validID(id string) error {
	if id == "" || len(id) > MaxIDLen || strings.ContainsRune(id, 0) {
		return fmt.Errorf("sandbox ID %.40q: use 1 to %d bytes without NUL: %w", id, MaxIDLen, errdefs.ErrInvalidArgument)
	}
	return nil
}

func linkUp(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	if err != nil {
		return fmt.Errorf("find %s: %w", name, err)
	}
	if err := h.LinkSetUp(l); err != nil {
		return fmt.Errorf("bring %s up: %w", name, err)
	}
	return nil
}

func delLink(h *netlink.Handle, name string) error {
	l, err := h.LinkByName(name)
	var nf netlink.LinkNotFoundError
	if errors.As(err, &nf) {
		return nil // the sandbox's namespace went and took the pair
	}
	if err != nil {
		return fmt.Errorf("find link %s: %w", name, err)
	}
	if err := h.LinkDel(l); err != nil && !errors.Is(err, unix.ENODEV) {
		return fmt.Errorf("remove link %s: %w", name, err)
	}
	return nil
}

// openNetNS opens path and checks that it is a network namespace.
func openNetNS(path string) (vnetns.NsHandle, error) {
	ns, err := vnetns.GetFromPath(path)
	if err != nil {
		return vnetns.None(), fmt.Errorf("open network namespace: %w", err)
	}
	t, err := unix.IoctlRetInt(int(ns), unix.NS_GET_NSTYPE)
	if err != nil || t != unix.CLONE_NEWNET {
		ns.Close()
		return vnetns.None(), fmt.Errorf("%s is not a network namespace: %w", path, errdefs.ErrInvalidArgument)
	}
	return ns, nil
}

func sameNS(a, b vnetns.NsHandle) (bool, error) {
	var sa, sb unix.Stat_t
	if err := unix.Fstat(int(a), &sa); err != nil {
		return false, err
	}
	if err := unix.Fstat(int(b), &sb); err != nil {
		return false, err
	}
	return sa.Dev == sb.Dev && sa.Ino == sb.Ino, nil
}

// isNSMount reports whether path is a namespace file mounted there.
func isNSMount(path string) (bool, error) {
	var st unix.Statfs_t
	err := unix.Statfs(path, &st)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("stat router namespace: %w", err)
	}
	return st.Type == unix.NSFS_MAGIC, nil
}

// createNS makes a new network namespace and bind-mounts it on path.
func createNS(path string) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	errc := make(chan error, 1)
	go func() {
		// Never unlocked: the thread leaves the namespace by exiting
		// with this goroutine, so no Go code runs in it afterwards.
		runtime.LockOSThread()
		if err := unix.Unshare(unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("unshare: %w", err)
			return
		}
		if err := unix.Mount("/proc/thread-self/ns/net", path, "", unix.MS_BIND, ""); err != nil {
			errc <- fmt.Errorf("bind mount: %w", err)
			return
		}
		errc <- nil
	}()
	if err := <-errc; err != nil {
		os.Remove(path)
		return err
	}
	return nil
}

// inNS runs fn on a locked OS thread in ns; the thread is discarded
// afterwards rather than switched back.
func inNS(ns vnetns.NsHandle, fn func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread() // never unlocked: see createNS
		if err := vnetns.Set(ns); err != nil {
			errc <- fmt.Errorf("enter namespace: %w", err)
			return
		}
		errc <- fn()
	}()
	return <-errc
}

func u32(a netip.Addr) uint32 {
	b := a.As4()
	return binary.BigEndian.Uint32(b[:])
}

func addr4(v uint32) netip.Addr {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], v)
	return netip.AddrFrom4(b)
}

// Do runs fn on a locked OS thread inside the router namespace and
// returns its error; the thread is discarded afterwards, never returned
// to Go's pool. Sockets fn creates stay in the router namespace (a socket
// keeps the namespace it was made in), so the node's proxy and resolver
// create their listeners here and use them from any goroutine.
func (r *Router) Do(fn func() error) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("router namespace: closed: %w", errdefs.ErrFailedPrecondition)
	}
	ns := r.ns
	r.mu.Unlock()
	return inNS(ns, fn)
}

// NSFd is an open descriptor of the router namespace, valid until Close
// (for netlink sockets bound to it, such as the node's nftables table).
func (r *Router) NSFd() int { return int(r.ns) }

// Pool is the network the sandboxes' addresses come from.
func (r *Router) Pool() netip.Prefix { return r.pool }

// Mount makes the router namespace nsFd (an open descriptor of a network
// namespace, such as one a replaced keeper handed over) the router of dir,
// so that the next Open adopts its links rather than creating a new
// namespace. A router already mounted in dir is left as it is.
func Mount(dir string, nsFd int) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("make router namespace dir: %w", err)
	}
	path := filepath.Join(dir, routerFile)
	isNS, err := isNSMount(path)
	if err != nil || isNS {
		return err
	}
	var st unix.Stat_t
	if err := unix.Fstat(nsFd, &st); err != nil {
		return fmt.Errorf("router namespace descriptor: %w", err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("remove stale router namespace file: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDONLY, 0o444)
	if err != nil {
		return err
	}
	f.Close()
	if err := unix.Mount(fmt.Sprintf("/proc/self/fd/%d", nsFd), path, "", unix.MS_BIND, ""); err != nil {
		os.Remove(path)
		return fmt.Errorf("mount the router namespace: %w", err)
	}
	if ok, err := isNSMount(path); err != nil || !ok {
		unix.Unmount(path, unix.MNT_DETACH)
		os.Remove(path)
		return fmt.Errorf("mount the router namespace: not a network namespace: %w", errdefs.ErrInvalidArgument)
	}
	return nil
}
