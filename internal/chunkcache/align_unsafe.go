package chunkcache

import "unsafe"

// alignedBuf returns a buffer of n bytes starting at a multiple of
// directAlign, as O_DIRECT needs.
func alignedBuf(n int) []byte {
	b := make([]byte, n+directAlign)
	skip := 0
	if r := int(uintptr(unsafe.Pointer(&b[0])) & (directAlign - 1)); r != 0 {
		skip = directAlign - r
	}
	return b[skip : skip+n : skip+n]
}

func isAligned(b []byte) bool {
	return len(b) == 0 || uintptr(unsafe.Pointer(&b[0]))&(directAlign-1) == 0
}
