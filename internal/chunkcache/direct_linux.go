package chunkcache

import "syscall"

const oDirect = syscall.O_DIRECT
