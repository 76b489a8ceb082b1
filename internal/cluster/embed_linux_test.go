package cluster

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestEmbeddedListensOnNoTCPPort checks that the process, with two embedded
// etcds running, has no listening TCP socket at all, so in particular not
// etcd's well-known 2379 and 2380.
func TestEmbeddedListensOnNoTCPPort(t *testing.T) {
	t.Parallel()
	startEmbedded(t, t.TempDir(), nil) // beside the shared one

	own := socketInodes(t)
	var ports []int
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		for _, l := range tcpListeners(t, file) {
			if own[l.inode] {
				ports = append(ports, l.port)
			}
		}
	}
	if len(ports) != 0 {
		t.Errorf("the process listens on TCP ports %v, want none", ports)
	}
}

// socketInodes returns the inodes of the sockets this process has open.
func socketInodes(t *testing.T) map[string]bool {
	t.Helper()
	fds, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	inodes := make(map[string]bool)
	for _, fd := range fds {
		link, err := os.Readlink(filepath.Join("/proc/self/fd", fd.Name()))
		if err != nil {
			continue // closed meanwhile
		}
		if ino, ok := strings.CutPrefix(link, "socket:["); ok {
			inodes[strings.TrimSuffix(ino, "]")] = true
		}
	}
	if len(inodes) == 0 {
		t.Fatal("no sockets in /proc/self/fd: the etcd socket should be there")
	}
	return inodes
}

type tcpListener struct {
	port  int
	inode string
}

// tcpListeners parses /proc/net/tcp{,6} for sockets in state LISTEN (0A).
func tcpListeners(t *testing.T, file string) []tcpListener {
	t.Helper()
	f, err := os.Open(file)
	if os.IsNotExist(err) && strings.HasSuffix(file, "6") {
		return nil // no IPv6
	}
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out []tcpListener
	sc := bufio.NewScanner(f)
	sc.Scan() // header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != "0A" {
			continue
		}
		_, portHex, _ := strings.Cut(fields[1], ":")
		port, err := strconv.ParseInt(portHex, 16, 32)
		if err != nil {
			t.Fatalf("%s: bad local address %q", file, fields[1])
		}
		out = append(out, tcpListener{port: int(port), inode: fields[9]})
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}
