package netfw

import (
	"errors"
	"fmt"
	"net/netip"
	"time"

	"github.com/google/nftables"
	"github.com/google/nftables/binaryutil"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// The sets that meter each source address.
const (
	dnsMeter  = "dns_meter"
	connMeter = "conn_meter"
	udpMeter  = "udp_meter"
)

// Install creates or replaces the table in the network namespace nsFd
// (the router's, never the host's): in one batch, so the kernel swaps the
// old table for the new one atomically.
//
// The rules, for packets arriving on a sandbox link (iifname "dsr*"):
//
//	prerouting (nat, dstnat): IPv4 UDP and TCP to port 53, any address:
//	    redirect to DNSPort; any other IPv4 TCP: redirect to ProxyPort.
//	input (filter): IPv6 dropped; established and related accepted;
//	    new UDP/TCP to DNSPort and TCP to ProxyPort accepted within the
//	    source's rate; everything else dropped (other protocols and
//	    ports, ICMP but conntrack's related errors, raw IP).
//	forward (filter, policy drop): nothing passes through the router.
//
// With a UDPPort, also:
//
//	udp (filter, mangle priority, before the NAT): IPv4 UDP to any port
//	    but 53: over the source's rate dropped; else marked UDPMark and
//	    sent by TPROXY to the relay's socket; dropped when it has none.
//	input: UDP marked UDPMark accepted.
func Install(nsFd int, cfg Config) error {
	if cfg.ProxyPort == 0 || cfg.DNSPort == 0 {
		return fmt.Errorf("router firewall: proxy and resolver ports are required: %w", errdefs.ErrInvalidArgument)
	}
	if nsFd < 0 {
		return fmt.Errorf("router firewall: no namespace: %w", errdefs.ErrInvalidArgument)
	}
	cfg.setDefaults()
	c, err := nftables.New(nftables.WithNetNSFd(nsFd))
	if err != nil {
		return fmt.Errorf("router firewall: nftables: %w", err)
	}
	t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	// Add then delete: deletes an old table whatever it holds, and makes
	// no error when there is none; the new one follows in the same batch.
	c.AddTable(t)
	c.DelTable(t)
	t = c.AddTable(&nftables.Table{Name: TableName, Family: nftables.TableFamilyINet})

	pre := c.AddChain(&nftables.Chain{
		Name: "prerouting", Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityNATDest,
	})
	accept := nftables.ChainPolicyAccept
	in := c.AddChain(&nftables.Chain{
		Name: "input", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept,
	})
	drop := nftables.ChainPolicyDrop
	c.AddChain(&nftables.Chain{
		Name: "forward", Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &drop,
	})

	var udp *nftables.Chain
	if cfg.UDPPort != 0 {
		udp = c.AddChain(&nftables.Chain{
			Name: "udp", Table: t, Type: nftables.ChainTypeFilter,
			Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityMangle, Policy: &accept,
		})
	}

	meters := []*nftables.Set{
		{Table: t, Name: dnsMeter, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: 65535},
		{Table: t, Name: connMeter, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: 65535},
	}
	if udp != nil {
		meters = append(meters, &nftables.Set{Table: t, Name: udpMeter, KeyType: nftables.TypeIPAddr, Dynamic: true, HasTimeout: true, Timeout: time.Minute, Size: 65535})
	}
	for _, s := range meters {
		if err := c.AddSet(s, nil); err != nil {
			return fmt.Errorf("router firewall: set %s: %w", s.Name, err)
		}
	}

	rule := func(ch *nftables.Chain, exprs ...[]expr.Any) {
		var all []expr.Any
		for _, e := range exprs {
			all = append(all, e...)
		}
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: all})
	}

	// prerouting: DNS first, then every other TCP connection.
	rule(pre, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), dport(53), redirect(cfg.DNSPort))
	rule(pre, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), dport(53), redirect(cfg.DNSPort))
	rule(pre, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), redirect(cfg.ProxyPort))

	if udp != nil {
		notDNS := dportNot(53)
		rule(udp, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), notDNS, overRate(udpMeter, cfg.UDPRate, cfg.UDPBurst, false), verdict(expr.VerdictDrop))
		rule(udp, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), notDNS, setMark(UDPMark), tproxy(cfg.UDPPort), verdict(expr.VerdictAccept))
		// TPROXY found no socket (the relay is gone): never routed.
		rule(udp, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), notDNS, verdict(expr.VerdictDrop))
	}

	// input.
	rule(in, fromSandbox(), nfproto(unix.NFPROTO_IPV6), verdict(expr.VerdictDrop))
	// Every DNS datagram is metered, before the established rule: a
	// flood from one source port is one conntrack flow.
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), dport(cfg.DNSPort), overRate(dnsMeter, cfg.DNSRate, cfg.DNSBurst, false), verdict(expr.VerdictDrop))
	rule(in, fromSandbox(), ctState(expr.CtStateBitESTABLISHED|expr.CtStateBitRELATED), verdict(expr.VerdictAccept))
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), dport(cfg.DNSPort), overRate(connMeter, cfg.ConnRate, cfg.ConnBurst, true), verdict(expr.VerdictDrop))
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), dport(cfg.ProxyPort), overRate(connMeter, cfg.ConnRate, cfg.ConnBurst, true), verdict(expr.VerdictDrop))
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), dport(cfg.DNSPort), verdict(expr.VerdictAccept))
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), dport(cfg.DNSPort), verdict(expr.VerdictAccept))
	rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_TCP), dport(cfg.ProxyPort), verdict(expr.VerdictAccept))
	if udp != nil {
		rule(in, fromSandbox(), ipv4(), l4(unix.IPPROTO_UDP), mark(UDPMark), verdict(expr.VerdictAccept))
	}
	rule(in, fromSandbox(), verdict(expr.VerdictDrop))

	if err := c.Flush(); err != nil {
		return fmt.Errorf("router firewall: install table: %w", err)
	}
	return nil
}

// Forget drops source address a from the per-source meters of the table in
// the namespace nsFd, so that a sandbox's deleted link leaves nothing in
// the firewall (the next sandbox given the address starts with a full
// budget). An address the meters do not hold is no error.
func Forget(nsFd int, a netip.Addr) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFd))
	if err != nil {
		return fmt.Errorf("router firewall: nftables: %w", err)
	}
	t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	key := a.Unmap().AsSlice()
	for _, name := range []string{dnsMeter, connMeter} {
		set := &nftables.Set{Table: t, Name: name, KeyType: nftables.TypeIPAddr}
		if err := c.SetDeleteElements(set, []nftables.SetElement{{Key: key}}); err != nil {
			return fmt.Errorf("router firewall: forget %s in %s: %w", a, name, err)
		}
		// One batch per set: deleting an element a set does not hold
		// fails its whole batch.
		if err := c.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("router firewall: forget %s in %s: %w", a, name, err)
		}
	}
	return nil
}

// Remove deletes the table from the namespace nsFd; no table is no error.
func Remove(nsFd int) error {
	c, err := nftables.New(nftables.WithNetNSFd(nsFd))
	if err != nil {
		return fmt.Errorf("router firewall: nftables: %w", err)
	}
	t := &nftables.Table{Name: TableName, Family: nftables.TableFamilyINet}
	c.AddTable(t)
	c.DelTable(t)
	if err := c.Flush(); err != nil {
		return fmt.Errorf("router firewall: remove table: %w", err)
	}
	return nil
}

// Installed reports whether the table is in the namespace nsFd.
func Installed(nsFd int) (bool, error) {
	c, err := nftables.New(nftables.WithNetNSFd(nsFd))
	if err != nil {
		return false, fmt.Errorf("router firewall: nftables: %w", err)
	}
	_, err = c.ListTableOfFamily(TableName, nftables.TableFamilyINet)
	if errors.Is(err, unix.ENOENT) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("router firewall: list tables: %w", err)
	}
	return true, nil
}

func fromSandbox() []expr.Any {
	// A comparison of the first len(LinkPrefix) bytes: nft's "dsr*".
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(LinkPrefix)},
	}
}

func nfproto(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyNFPROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func ipv4() []expr.Any { return nfproto(unix.NFPROTO_IPV4) }

func l4(p byte) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{p}},
	}
}

func dport(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func dportNot(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
	}
}

func setMark(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)},
		&expr.Meta{Key: expr.MetaKeyMARK, SourceRegister: true, Register: 1},
	}
}

func mark(m uint32) []expr.Any {
	return []expr.Any{
		&expr.Meta{Key: expr.MetaKeyMARK, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(m)},
	}
}

// tproxy is nft's "tproxy ip to :p": the datagram keeps its addresses
// and is given to the transparent socket listening on port p.
func tproxy(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.TProxy{Family: byte(nftables.TableFamilyIPv4), TableFamily: byte(nftables.TableFamilyINet), RegPort: 1},
	}
}

func redirect(p uint16) []expr.Any {
	return []expr.Any{
		&expr.Immediate{Register: 1, Data: binaryutil.BigEndian.PutUint16(p)},
		&expr.Redir{RegisterProtoMin: 1, Flags: unix.NF_NAT_RANGE_PROTO_SPECIFIED},
	}
}

func ctState(bits uint32) []expr.Any {
	return []expr.Any{
		&expr.Ct{Register: 1, Key: expr.CtKeySTATE},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: binaryutil.NativeEndian.PutUint32(bits), Xor: binaryutil.NativeEndian.PutUint32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: binaryutil.NativeEndian.PutUint32(0)},
	}
}

// overRate matches a packet (of a new connection, when newOnly) whose
// source address is over rate a second (burst at once) in the meter set:
// nft's "[ct state new] update @set { ip saddr limit rate over R/second
// burst B packets }".
func overRate(set string, rate, burst uint32, newOnly bool) []expr.Any {
	var pre []expr.Any
	if newOnly {
		pre = ctState(expr.CtStateBitNEW)
	}
	return append(pre,
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Dynset{SrcRegKey: 1, SetName: set, Operation: uint32(unix.NFT_DYNSET_OP_UPDATE),
			Exprs: []expr.Any{&expr.Limit{Type: expr.LimitTypePkts, Rate: uint64(rate), Over: true, Unit: expr.LimitTimeSecond, Burst: burst}}},
	)
}

func verdict(k expr.VerdictKind) []expr.Any {
	return []expr.Any{&expr.Verdict{Kind: k}}
}
