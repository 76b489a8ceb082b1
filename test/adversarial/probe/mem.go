package main

import (
	"flag"
	"fmt"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// memholdCmd holds memory the way a sandbox being paused does, and shows
// whether it runs and whether its memory is intact:
//
//	probe memhold [-lock MIB] [-fork] [-dir DIR] MIB
//
// It maps MIB MiB of anonymous memory and fills it with a pseudo-random
// pattern (dirty pages, incompressible), writes the pattern's checksum
// to DIR/memhold.sum (its pid to DIR/memhold.pid), prints "ready SUM", then every 20 ms counts: it
// writes the count to DIR/counter and prints "tick N". On SIGUSR1 it
// reads all of the memory again and writes the checksum it finds to
// DIR/memhold.check (and prints "check SUM"). With -lock it also locks
// MIB MiB more in RAM (mlock; prints "mlock ok" or the errno), with
// -fork it forks a child that shares the memory copy-on-write and
// sleeps. DIR is /tmp by default.
func memholdCmd(args []string) error {
	fs := flag.NewFlagSet("memhold", flag.ContinueOnError)
	lock := fs.Int("lock", 0, "MiB to lock in RAM")
	fork := fs.Bool("fork", false, "fork a child sharing the memory")
	dir := fs.String("dir", "/tmp", "where the files go")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return fmt.Errorf("want MIB")
	}
	mib, err := strconv.Atoi(fs.Arg(0))
	if err != nil || mib < 1 {
		return fmt.Errorf("MIB %q: want a positive number", fs.Arg(0))
	}
	mem, err := unix.Mmap(-1, 0, mib<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		return fmt.Errorf("mmap: %v", err)
	}
	sum := fill(mem)
	if *lock > 0 {
		l, err := unix.Mmap(-1, 0, *lock<<20, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
		if err != nil {
			return fmt.Errorf("mmap: %v", err)
		}
		fill(l)
		report("mlock", unix.Mlock(l))
	}
	if *fork {
		// A raw fork: the child runs no Go code, only pause(2), while it
		// shares every page with its parent.
		pid, _, errno := syscall.RawSyscall(syscall.SYS_FORK, 0, 0, 0)
		if errno != 0 {
			report("fork", errno)
		} else if pid == 0 {
			for {
				syscall.RawSyscall(syscall.SYS_PAUSE, 0, 0, 0)
			}
		} else {
			fmt.Println("fork", pid)
		}
	}
	if err := put(*dir, "memhold.pid", strconv.Itoa(os.Getpid())+"\n"); err != nil {
		return err
	}
	if err := put(*dir, "memhold.sum", fmt.Sprintf("%016x\n", sum)); err != nil {
		return err
	}
	fmt.Printf("ready %016x\n", sum)
	usr1 := make(chan os.Signal, 1)
	signal.Notify(usr1, syscall.SIGUSR1)
	tick := time.NewTicker(20 * time.Millisecond)
	for n := 1; ; {
		select {
		case <-usr1:
			s := check(mem)
			if err := put(*dir, "memhold.check", fmt.Sprintf("%016x\n", s)); err != nil {
				return err
			}
			fmt.Printf("check %016x\n", s)
		case <-tick.C:
			if err := put(*dir, "counter", strconv.Itoa(n)+"\n"); err != nil {
				return err
			}
			fmt.Println("tick", n)
			n++
		}
	}
}

// put writes a file whole (a reader never sees a part).
func put(dir, name, data string) error {
	tmp := filepath.Join(dir, "."+name+".tmp")
	if err := os.WriteFile(tmp, []byte(data), 0o644); err != nil {
		return err
	}
	return os.Rename(tmp, filepath.Join(dir, name))
}
