//go:build !dsec_crashhook

package edge

// crashPoint is where a test build (-tags dsec_crashhook) can kill the
// process, to test what a restart recovers (crash_on.go). In every other
// build it does nothing.
func crashPoint(string) {}
