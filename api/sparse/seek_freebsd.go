package sparse

// The whence values of lseek(2) that find data and holes (sys/unistd.h);
// package syscall does not define them.
const (
	seekData = 3
	seekHole = 4
)
