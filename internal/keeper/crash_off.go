//go:build !dsec_crashhook

package keeper

// crashPoint is where a test build (-tags dsec_crashhook) can kill the
// keeper, to test what a restart recovers (crash_on.go). In every other
// build it does nothing.
func crashPoint(string) {}
