// Package adversarial attacks a real dsec the way a cheating agent inside a
// sandbox or a hostile tenant with its own API key would, and asserts the
// safe outcome of each attack. Its tests are root tests: they skip without
// root on a developer's machine (testenv.RequireRoot) and fail instead of
// skipping in CI (CI=true), where they run in scripts/test.sh.
//
// All tests of the package share one `dsec up` (its own state dir, port and
// cgroup parent; internal/testenv/platform) with one busybox image, started
// by the first test that asks for it (Env) and stopped by TestMain, which
// also fails the run when the platform left anything on the host. The
// whole package must stay within a CI budget of 5 minutes.
//
// # Adding an attack
//
// Put attacks of one area in one file, <area>_test.go (images_test.go for
// image attacks, files_test.go for the file API, tenants_test.go for other
// projects' keys, …), so that several people can add attacks without
// touching each other's files. Each attack is a Test function that:
//
//   - starts with `p := Env(t)` (skips without root, starts the shared
//     platform on first use) and calls t.Parallel() unless it loads the
//     whole machine (fork and memory bombs) or changes something shared;
//   - says in its doc comment which protection it relies on, and asserts
//     on what a user would see if that protection were removed (a test
//     that only checks for an error cannot fail);
//   - uses Shared(t) for a sandbox it does not spoil (work under a
//     directory of its own name, Scratch) or NewSandbox for one it does;
//     NewSandbox's sandboxes are deleted when the test ends;
//   - runs commands inside with Sh (stdout, stderr, exit status), as
//     another project with Intruder(t), raw system calls with the probe
//     (InstallProbe; add a command to probe/ for a new kind of call) and
//     checks the host with Host and HostAlive.
//
// Failures read `Op(%q) = %v, want %v`. A finding that does not hold yet
// is written as a test too, skipped with t.Skip naming the finding of the
// issue that fixes it, until that fix lands.
package adversarial
