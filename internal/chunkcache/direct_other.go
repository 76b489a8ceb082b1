//go:build !linux

package chunkcache

// oDirect is 0 where O_DIRECT does not exist: DirectIO is then buffered.
const oDirect = 0
