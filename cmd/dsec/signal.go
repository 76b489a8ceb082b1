package main

import (
	"strconv"
	"strings"
)

// linuxSignals are the signal numbers of Linux, the sandboxes' kernel (the
// client's own may differ: SIGUSR1 is 30 on macOS).
var linuxSignals = map[string]int{
	"HUP": 1, "INT": 2, "QUIT": 3, "ILL": 4, "TRAP": 5, "ABRT": 6, "IOT": 6, "BUS": 7, "FPE": 8,
	"KILL": 9, "USR1": 10, "SEGV": 11, "USR2": 12, "PIPE": 13, "ALRM": 14, "TERM": 15,
	"STKFLT": 16, "CHLD": 17, "CONT": 18, "STOP": 19, "TSTP": 20, "TTIN": 21, "TTOU": 22,
	"URG": 23, "XCPU": 24, "XFSZ": 25, "VTALRM": 26, "PROF": 27, "WINCH": 28, "IO": 29,
	"POLL": 29, "PWR": 30, "SYS": 31,
}

// parseSignal parses a signal as a Linux number (1 to 64) or a name with or
// without SIG (TERM, SIGKILL, int), or RTMIN+N / RTMAX-N.
func parseSignal(s string) (int, error) {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 || n > 64 {
			return 0, usageErrorf("signal %d: Linux signals are 1 to 64", n)
		}
		return n, nil
	}
	name := strings.TrimPrefix(strings.ToUpper(s), "SIG")
	if n, ok := linuxSignals[name]; ok {
		return n, nil
	}
	for _, rt := range []struct {
		prefix string
		base   int
		op     byte // the sign that may follow: RTMIN+N, RTMAX-N
	}{{"RTMIN", 34, '+'}, {"RTMAX", 64, '-'}} {
		rest, ok := strings.CutPrefix(name, rt.prefix)
		if !ok {
			continue
		}
		if rest == "" {
			return rt.base, nil
		}
		off, err := strconv.Atoi(rest[1:])
		if rest[0] != rt.op || err != nil || off < 0 || off > 30 {
			break
		}
		if rt.op == '-' {
			off = -off
		}
		return rt.base + off, nil
	}
	return 0, usageErrorf("unknown signal %q: give a name like TERM, KILL, INT, HUP, USR1 or a number", s)
}

// signalName returns the name of Linux signal n without SIG, or "" when it
// has none.
func signalName(n int) string {
	best := ""
	for name, v := range linuxSignals {
		// IOT and POLL are aliases; prefer ABRT and IO.
		if v == n && name != "IOT" && name != "POLL" && (best == "" || name < best) {
			best = name
		}
	}
	return best
}
