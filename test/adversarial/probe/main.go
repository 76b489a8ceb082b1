// Command probe is the adversarial suite's attacker inside a sandbox: the
// suite builds it (static, no cgo), uploads it into a sandbox and runs it
// there for attacks busybox cannot make, such as raw system calls.
//
//	probe COMMAND [ARG...]
//
// It prints one line per attempt on stdout, "NAME ok" when the attempt
// succeeded or "NAME ERRNO" (EPERM, ENOSYS, …) when the kernel refused it,
// and exits 2 on a usage error only: a refused attack is not a failure of
// the probe.
package main

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// commands are probe's commands, by name.
var commands = map[string]func(args []string) error{
	"syscall":  syscallCmd,
	"ptrace":   ptraceCmd,
	"connect":  connectCmd,
	"raw":      rawCmd,
	"spoofdns": spoofDNSCmd,
	"udp":      udpCmd,
	"banner":   bannerCmd,
	"chroot":   chrootCmd,
	"init":     initCmd,
	"inotify":  inotifyCmd,
	"hijack":   hijackCmd,
	"memhold":  memholdCmd,
	"api":      apiCmd,
	"mark":     markCmd,
}

func main() {
	if len(os.Args) < 2 || commands[os.Args[1]] == nil {
		names := make([]string, 0, len(commands))
		for n := range commands {
			names = append(names, n)
		}
		sort.Strings(names)
		fmt.Fprintf(os.Stderr, "usage: probe %s [ARG...]\n", strings.Join(names, "|"))
		os.Exit(2)
	}
	if err := commands[os.Args[1]](os.Args[2:]); err != nil {
		fmt.Fprintf(os.Stderr, "probe %s: %v\n", os.Args[1], err)
		os.Exit(2)
	}
}

// report prints how one attempt ended.
func report(name string, err error) {
	var errno syscall.Errno
	switch {
	case err == nil:
		fmt.Println(name, "ok")
	case errors.As(err, &errno):
		fmt.Println(name, unix.ErrnoName(errno))
	default:
		fmt.Println(name, err)
	}
}
