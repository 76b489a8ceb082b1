//go:build !unix

package cluster

// lockFile does nothing where flock(2) does not exist; etcd's own file locks
// still keep a second etcd out of the data directory.
func lockFile(path string) (unlock func(), err error) { return func() {}, nil }
