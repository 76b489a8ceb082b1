package sparse

// The whence values of lseek(2) that find data and holes (linux/fs.h);
// package syscall does not define them.
const (
	seekData = 3
	seekHole = 4
)
