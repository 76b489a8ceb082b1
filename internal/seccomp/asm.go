package seccomp

import (
	"encoding/binary"
	"fmt"
	"slices"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// MaxInsns is the kernel's limit on the length of a classic BPF program
// (BPF_MAXINSNS); Compile never returns a longer filter.
const MaxInsns = 4096

// insnSize is the size of one encoded struct sock_filter.
const insnSize = 8

// Parts of classic BPF opcodes (linux/bpf_common.h), only those the
// assembler emits.
const (
	bpfLD   = 0x00 // class: load into A
	bpfALU  = 0x04 // class: arithmetic on A
	bpfJMP  = 0x05 // class: jumps
	bpfRET  = 0x06 // class: return
	bpfW    = 0x00 // size: 32-bit word
	bpfABS  = 0x20 // mode: absolute offset into the data
	bpfK    = 0x00 // source: the constant k
	bpfAND  = 0x50 // ALU op
	bpfJA   = 0x00 // jump always (k is the offset)
	bpfJEQ  = 0x10 // jump if A == k
	bpfJGT  = 0x20 // jump if A > k
	bpfJGE  = 0x30 // jump if A >= k
	bpfJSET = 0x40 // jump if A & k != 0
)

// insn is one classic BPF instruction, a struct sock_filter.
type insn struct {
	code   uint16
	jt, jf uint8
	k      uint32
}

// encode returns prog as an array of struct sock_filter, little endian
// (the byte order of every architecture Compile supports).
func encode(prog []insn) []byte {
	b := make([]byte, 0, len(prog)*insnSize)
	for _, in := range prog {
		b = binary.LittleEndian.AppendUint16(b, in.code)
		b = append(b, in.jt, in.jf)
		b = binary.LittleEndian.AppendUint32(b, in.k)
	}
	return b
}

// asm assembles a classic BPF program with jumps to named labels. Every
// jump goes forward, as classic BPF requires. A conditional jump's target
// "" is the next instruction. The first error sticks and is returned by
// assemble.
type asm struct {
	items  []item
	labels map[string]int // label → index in items of the instruction it names
	err    error
}

// item is an instruction before its jump offsets are known.
type item struct {
	insn
	jt, jf string // targets of a conditional jump; "" is the next instruction
	ja     string // target of an unconditional jump
}

// label names the next instruction emitted.
func (a *asm) label(name string) {
	if a.labels == nil {
		a.labels = map[string]int{}
	}
	if _, dup := a.labels[name]; dup && a.err == nil {
		a.err = fmt.Errorf("bpf: label %q defined twice: %w", name, errdefs.ErrInvalidArgument)
	}
	a.labels[name] = len(a.items)
}

// ld loads the 32-bit word at offset k of the data into A.
func (a *asm) ld(k uint32) { a.emit(item{insn: insn{code: bpfLD | bpfW | bpfABS, k: k}}) }

// and sets A to A & k.
func (a *asm) and(k uint32) { a.emit(item{insn: insn{code: bpfALU | bpfAND | bpfK, k: k}}) }

// ret ends the program with the value k.
func (a *asm) ret(k uint32) { a.emit(item{insn: insn{code: bpfRET | bpfK, k: k}}) }

// ja jumps to target.
func (a *asm) ja(target string) {
	if target == "" && a.err == nil {
		a.err = fmt.Errorf("bpf: ja without a target: %w", errdefs.ErrInvalidArgument)
	}
	a.emit(item{insn: insn{code: bpfJMP | bpfJA}, ja: target})
}

// jeq jumps to jt if A == k, else to jf.
func (a *asm) jeq(k uint32, jt, jf string) { a.jcond(bpfJEQ, k, jt, jf) }

// jgt jumps to jt if A > k, else to jf.
func (a *asm) jgt(k uint32, jt, jf string) { a.jcond(bpfJGT, k, jt, jf) }

// jge jumps to jt if A >= k, else to jf.
func (a *asm) jge(k uint32, jt, jf string) { a.jcond(bpfJGE, k, jt, jf) }

// jset jumps to jt if A & k != 0, else to jf.
func (a *asm) jset(k uint32, jt, jf string) { a.jcond(bpfJSET, k, jt, jf) }

func (a *asm) jcond(op uint16, k uint32, jt, jf string) {
	a.emit(item{insn: insn{code: bpfJMP | op | bpfK, k: k}, jt: jt, jf: jf})
}

func (a *asm) emit(it item) { a.items = append(a.items, it) }

// assemble resolves the labels and returns the program.
//
// Conditional jumps have 8-bit offsets. A conditional jump whose target is
// farther than 255 instructions gets a trampoline, a ja (32-bit offset) to
// the target placed right after it, and jumps there instead.
//
// The program is placed backwards, from its last instruction to its first.
// Every jump goes forward, so when a jump is placed everything between it
// and its targets already is, trampolines included, and nothing placed
// later comes between them: its offsets are final, and one pass places
// every trampoline needed and no other.
func (a *asm) assemble() ([]insn, error) {
	if a.err != nil {
		return nil, a.err
	}
	n := len(a.items)
	if n == 0 {
		return nil, fmt.Errorf("bpf: empty program: %w", errdefs.ErrInvalidArgument)
	}
	if a.items[n-1].code&0x07 != bpfRET {
		return nil, fmt.Errorf("bpf: the last instruction is not a ret: %w", errdefs.ErrInvalidArgument)
	}
	target := func(i int, label string) (int, error) {
		if label == "" {
			return i + 1, nil // the ret check above keeps this inside
		}
		t, ok := a.labels[label]
		switch {
		case !ok:
			return 0, fmt.Errorf("bpf: jump to undefined label %q: %w", label, errdefs.ErrInvalidArgument)
		case t <= i:
			return 0, fmt.Errorf("bpf: jump back to label %q: %w", label, errdefs.ErrInvalidArgument)
		case t >= n:
			return 0, fmt.Errorf("bpf: label %q names no instruction: %w", label, errdefs.ErrInvalidArgument)
		}
		return t, nil
	}

	// rev is the program from its end; fromEnd[i] is item i's index in it.
	// The offset of a jump at r to an instruction at rt is r-rt-1.
	rev := make([]insn, 0, n)
	fromEnd := make([]int, n)
	for i := n - 1; i >= 0; i-- {
		it := a.items[i]
		in := it.insn
		switch {
		case it.code == bpfJMP|bpfJA:
			t, err := target(i, it.ja)
			if err != nil {
				return nil, err
			}
			in.k = uint32(len(rev) - fromEnd[t] - 1)
		case it.code&0x07 == bpfJMP:
			t, err := target(i, it.jt)
			if err != nil {
				return nil, err
			}
			f, err := target(i, it.jf)
			if err != nil {
				return nil, err
			}
			rt, rf := fromEnd[t], fromEnd[f]
			// With k trampolines the jump sits at len(rev)+k; each one
			// it needs moves it away from its targets, so count again
			// until the count holds (at most twice more).
			farT, farF := false, false
			for k := -1; k != b2i(farT)+b2i(farF); {
				k = b2i(farT) + b2i(farF)
				at := len(rev) + k
				farT, farF = at-rt-1 > 0xff, at-rf-1 > 0xff
			}
			// Placed backwards: the jf trampoline comes after the jt one.
			if farF {
				rev = append(rev, insn{code: bpfJMP | bpfJA, k: uint32(len(rev) - rf - 1)})
				rf = len(rev) - 1
			}
			if farT {
				rev = append(rev, insn{code: bpfJMP | bpfJA, k: uint32(len(rev) - rt - 1)})
				rt = len(rev) - 1
			}
			in.jt = uint8(len(rev) - rt - 1)
			in.jf = uint8(len(rev) - rf - 1)
		}
		fromEnd[i] = len(rev)
		rev = append(rev, in)
	}
	if len(rev) > MaxInsns {
		return nil, fmt.Errorf("bpf: program of %d instructions exceeds the kernel's limit of %d: %w", len(rev), MaxInsns, errdefs.ErrInvalidArgument)
	}
	slices.Reverse(rev)
	return rev, nil
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}
