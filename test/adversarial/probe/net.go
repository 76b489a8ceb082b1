package main

import (
	"errors"
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
