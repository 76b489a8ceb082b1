package sparse

// The whence values of lseek(2) that find data and holes (sys/unistd.h:
// the reverse of Linux's); package syscall does not define them.
const (
	seekData = 4
	seekHole = 3
)
