package main

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// connectCmd dials each HOST:PORT in args over TCP with a timeout of two
// seconds and reports "connect:HOST:PORT ok|ERRNO|timeout".
func connectCmd(args []string) error {
	for _, a := range args {
		c, err := net.DialTimeout("tcp", a, 2*time.Second)
		if err == nil {
			c.Close()
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			err = errors.New("timeout")
		}
		report("connect:"+a, err)
	}
	return nil
}

// rawCmd opens a raw ICMP socket and sends an echo request to each address
// in args, and reports "raw:ADDR ok|ERRNO" for the send.
func rawCmd(args []string) error {
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_ICMP)
	if err != nil {
		report("raw:socket", err)
		return nil
	}
	defer unix.Close(fd)
	echo := []byte{8, 0, 0xf7, 0xff, 0, 0, 0, 0} // type 8, code 0, checksum, id 0, seq 0
	for _, a := range args {
		ip := net.ParseIP(a).To4()
		if ip == nil {
			report("raw:"+a, os.ErrInvalid)
			continue
		}
		sa := &unix.SockaddrInet4{Addr: [4]byte(ip)}
		report("raw:"+a, unix.Sendto(fd, echo, 0, sa))
	}
	return nil
}

// spoofDNSCmd sends, through a raw IP socket (IP_HDRINCL), a DNS query for
// example.com from source address args[0] to args[1] port 53, once for
// each further destination in args[1:], and reports "spoofdns:DST ok|ERRNO"
// for the send. Whatever answers goes to the forged source, not here.
func spoofDNSCmd(args []string) error {
	if len(args) < 2 {
		return errors.New("usage: spoofdns SRC DST [DST]")
	}
	src := net.ParseIP(args[0]).To4()
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_RAW, unix.IPPROTO_RAW)
	if err != nil {
		report("spoofdns:socket", err)
		return nil
	}
	defer unix.Close(fd)
	query := []byte{0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0, 7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1}
	for _, a := range args[1:] {
		dst := net.ParseIP(a).To4()
		if src == nil || dst == nil {
			report("spoofdns:"+a, os.ErrInvalid)
			continue
		}
		udpLen := 8 + len(query)
		pkt := make([]byte, 20+udpLen)
		pkt[0], pkt[8], pkt[9] = 0x45, 64, unix.IPPROTO_UDP // version 4, IHL 5; TTL; UDP
		pkt[2], pkt[3] = byte(len(pkt)>>8), byte(len(pkt))
		copy(pkt[12:16], src)
		copy(pkt[16:20], dst)
		u := pkt[20:]
		u[0], u[1], u[2], u[3] = 0xd5, 0xec, 0, 53 // source port 54764, destination 53
		u[4], u[5] = byte(udpLen>>8), byte(udpLen) // checksum 0: none (IPv4)
		copy(u[8:], query)
		// The kernel fills the IP checksum and ID of an IP_HDRINCL packet.
		report("spoofdns:"+a, unix.Sendto(fd, pkt, 0, &unix.SockaddrInet4{Addr: [4]byte(dst)}))
	}
	return nil
}

// udpCmd sends a datagram to each HOST:PORT in args from a connected UDP
// socket, up to five times 300 ms apart (a new link drops what is sent
// before it is up; a UDP client retries), and reports "udp:HOST:PORT ok"
// when the same bytes come back, "timeout" when nothing does, or the
// error.
func udpCmd(args []string) error {
	for _, a := range args {
		report("udp:"+a, udpEcho(a))
	}
	return nil
}

func udpEcho(addr string) error {
	c, err := net.Dial("udp4", addr)
	if err != nil {
		return err
	}
	defer c.Close()
	msg := []byte("dsec-probe-udp " + addr)
	buf := make([]byte, 2048)
	for range 5 {
		if _, err := c.Write(msg); err != nil {
			return err
		}
		c.SetReadDeadline(time.Now().Add(300 * time.Millisecond))
		for {
			n, err := c.Read(buf)
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				break
			}
			if err != nil {
				return err
			}
			if string(buf[:n]) == string(msg) {
				return nil
			}
		}
	}
	return errors.New("timeout")
}

// bannerCmd connects to each HOST:PORT in args over TCP and reads what
// the server says first; it reports "banner:HOST:PORT ok" when that is
// the test's banner "dsec-world\n", else the error (a connection the
// egress proxy refuses is accepted by the proxy and then reset, so a
// bare connect proves nothing).
func bannerCmd(args []string) error {
	for _, a := range args {
		report("banner:"+a, readBanner(a))
	}
	return nil
}

func readBanner(addr string) error {
	c, err := net.DialTimeout("tcp4", addr, 2*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetReadDeadline(time.Now().Add(3 * time.Second))
	got, err := io.ReadAll(io.LimitReader(c, 64))
	if string(got) == "dsec-world\n" {
		return nil
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		return errors.New("timeout")
	}
	if err != nil {
		return err
	}
	return fmt.Errorf("read %q", got)
}
