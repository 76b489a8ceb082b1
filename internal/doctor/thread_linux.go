package doctor

import (
	"fmt"
	"runtime"

	"golang.org/x/sys/unix"
)

// onThrowawayThread runs fn on an OS thread of its own that ends when fn
// returns, so that what fn changes in the thread's kernel state (its mount
// namespace, a seccomp filter, no_new_privs) goes with it. The Go runtime
// ends a goroutine's thread when the goroutine exits while locked to it,
// and never clones a new thread from a locked one.
func onThrowawayThread(fn func() error) error {
	errc := make(chan error, 1)
	go runLocked(fn, errc)
	return <-errc
}

// runLocked runs fn locked to the current thread and leaves the thread
// locked, so that it ends with the goroutine; on the main thread it hands
// fn to another goroutine instead.
func runLocked(fn func() error, errc chan<- error) {
	runtime.LockOSThread()
	if unix.Gettid() == unix.Getpid() {
		// The main thread never ends (Go parks it for good instead), and
		// /proc/self shows its view: keep it as it is. While this goroutine
		// holds it, the new one runs on another thread.
		done := make(chan struct{})
		go func() {
			defer close(done)
			runLocked(fn, errc)
		}()
		<-done
		runtime.UnlockOSThread()
		return
	}
	// Never unlocked: the thread dies with this goroutine.
	defer func() {
		if p := recover(); p != nil {
			errc <- fmt.Errorf("probe panicked: %v", p)
		}
	}()
	errc <- fn()
}

// inPrivateMountNS runs fn on a throwaway thread in a mount namespace of
// its own in which every mount is private: mounts fn makes are never seen
// by the host (or any other namespace), and the namespace ends with the
// thread. fn should still undo its mounts.
func inPrivateMountNS(fn func() error) error {
	return onThrowawayThread(func() error {
		if err := unix.Unshare(unix.CLONE_NEWNS); err != nil {
			return fmt.Errorf("unshare mount namespace: %w", err)
		}
		if err := unix.Mount("", "/", "", unix.MS_REC|unix.MS_PRIVATE, ""); err != nil {
			return fmt.Errorf("make mounts private: %w", err)
		}
		return fn()
	})
}
