package main

import "unsafe"

// fill writes a xorshift pattern to every word of mem and returns its
// checksum.
func fill(mem []byte) uint64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), len(mem)/8)
	x, sum := uint64(88172645463325252), uint64(0)
	for i := range words {
		x ^= x << 13
		x ^= x >> 7
		x ^= x << 17
		words[i] = x
		sum = sum*31 + x
	}
	return sum
}

// check reads every word of mem and returns their checksum.
func check(mem []byte) uint64 {
	words := unsafe.Slice((*uint64)(unsafe.Pointer(&mem[0])), len(mem)/8)
	var sum uint64
	for _, w := range words {
		sum = sum*31 + w
	}
	return sum
}
