package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/dsecproject/dsec/internal/errdefs"
)

var cmpInsn = cmp.AllowUnexported(insn{})

func TestAssemble(t *testing.T) {
	tests := []struct {
		name  string
		build func(a *asm)
		want  []insn
	}{
		{
			"fall through and labels",
			func(a *asm) {
				a.ld(4)
				a.jeq(7, "", "no")
				a.ld(0)
				a.jset(1, "yes", "no")
				a.label("yes")
				a.ret(1)
				a.label("no")
				a.ret(2)
			},
			[]insn{
				{code: bpfLD | bpfW | bpfABS, k: 4},
				{code: bpfJMP | bpfJEQ | bpfK, jt: 0, jf: 3, k: 7},
				{code: bpfLD | bpfW | bpfABS, k: 0},
				{code: bpfJMP | bpfJSET | bpfK, jt: 0, jf: 1, k: 1},
				{code: bpfRET | bpfK, k: 1},
				{code: bpfRET | bpfK, k: 2},
			},
		},
		{
			"every op",
			func(a *asm) {
				a.ld(16)
				a.and(0xff)
				a.jgt(3, "end", "")
				a.jge(2, "", "end")
				a.ja("end")
				a.label("end")
				a.ret(0)
			},
			[]insn{
				{code: bpfLD | bpfW | bpfABS, k: 16},
				{code: bpfALU | bpfAND | bpfK, k: 0xff},
				{code: bpfJMP | bpfJGT | bpfK, jt: 2, jf: 0, k: 3},
				{code: bpfJMP | bpfJGE | bpfK, jt: 0, jf: 1, k: 2},
				{code: bpfJMP | bpfJA, k: 0},
				{code: bpfRET | bpfK, k: 0},
			},
		},
		{
			"two labels on one instruction",
			func(a *asm) {
				a.ld(0)
				a.jeq(1, "a", "b")
				a.label("a")
				a.label("b")
				a.ret(5)
			},
			[]insn{
				{code: bpfLD | bpfW | bpfABS, k: 0},
				{code: bpfJMP | bpfJEQ | bpfK, k: 1},
				{code: bpfRET | bpfK, k: 5},
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a asm
			tt.build(&a)
			got, err := a.assemble()
			if err != nil {
				t.Fatalf("assemble() = %v", err)
			}
			if diff := cmp.Diff(tt.want, got, cmpInsn); diff != "" {
				t.Errorf("assemble() differs (-want +got):\n%s", diff)
			}
		})
	}
}

// padding emits n loads, which change nothing a program returns.
func padding(a *asm, n int) {
	for range n {
		a.ld(0)
	}
}

// TestAssembleLongJumps checks programs whose conditional jumps reach past
// 255 instructions: each must run as written, and the assembler must add
// the trampolines the comments expect, no more.
func TestAssembleLongJumps(t *testing.T) {
	tests := []struct {
		name        string
		build       func(a *asm)
		trampolines int
		// want maps the word at offset 0 of the data to the value the
		// program returns.
		want map[uint32]uint32
	}{
		{
			"255 between: fits",
			func(a *asm) {
				a.ld(0)
				a.jeq(1, "far", "")
				padding(a, 254)
				a.ret(2)
				a.label("far")
				a.ret(1)
			},
			0,
			map[uint32]uint32{1: 1, 0: 2},
		},
		{
			"256 between: jt far",
			func(a *asm) {
				a.ld(0)
				a.jeq(1, "far", "")
				padding(a, 255)
				a.ret(2)
				a.label("far")
				a.ret(1)
			},
			1,
			map[uint32]uint32{1: 1, 0: 2},
		},
		{
			"300 between: jf far, jt next",
			func(a *asm) {
				a.ld(0)
				a.jeq(1, "", "far")
				a.ret(1)
				padding(a, 300)
				a.label("far")
				a.ret(2)
			},
			1,
			map[uint32]uint32{1: 1, 0: 2, 7: 2},
		},
		{
			"both far, to different targets",
			func(a *asm) {
				a.ld(0)
				a.jset(1, "odd", "even")
				a.ret(9)
				padding(a, 400)
				a.label("odd")
				a.ret(1)
				padding(a, 300)
				a.label("even")
				a.ret(2)
			},
			2,
			map[uint32]uint32{1: 1, 2: 2, 3: 1},
		},
		{
			// The trampoline of the second jump pushes the first out of
			// range: placement must repeat.
			"one trampoline makes another",
			func(a *asm) {
				a.ld(0)
				a.jeq(1, "a", "")  // 255 instructions to a: fits, until one is added
				a.jeq(2, "b", "c") // b is far, c 255 away
				padding(a, 254)
				a.label("a")
				a.ret(1)
				a.label("c")
				a.ret(3)
				padding(a, 200)
				a.label("b")
				a.ret(2)
			},
			3, // b's pushes a and c out of range
			map[uint32]uint32{1: 1, 2: 2, 3: 3},
		},
		{
			"chain of many long jumps to one target",
			func(a *asm) {
				a.ld(0)
				for i := range 40 {
					a.jeq(uint32(i), "end", "")
					padding(a, 20)
				}
				a.ret(100)
				a.label("end")
				a.ret(200)
			},
			40 - 12, // the last 12 jumps are within 255 of the end
			map[uint32]uint32{0: 200, 5: 200, 39: 200, 40: 100},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a asm
			tt.build(&a)
			prog, err := a.assemble()
			if err != nil {
				t.Fatalf("assemble() = %v", err)
			}
			if got, want := len(prog)-len(a.items), tt.trampolines; got != want {
				t.Errorf("assemble() added %d trampolines, want %d", got, want)
			}
			for in, want := range tt.want {
				got, _, err := run(prog, binary.LittleEndian.AppendUint32(nil, in))
				if err != nil || got != want {
					t.Errorf("run(assembled, %d) = %d, %v; want %d", in, got, err, want)
				}
			}
		})
	}
}

func TestAssembleErrors(t *testing.T) {
	tests := []struct {
		name  string
		build func(a *asm)
	}{
		{"empty", func(a *asm) {}},
		{"no ret at the end", func(a *asm) { a.ret(0); a.ld(0) }},
		{"undefined label", func(a *asm) { a.jeq(0, "nowhere", ""); a.ret(0) }},
		{"label twice", func(a *asm) { a.label("x"); a.ld(0); a.label("x"); a.ret(0) }},
		{"backward jump", func(a *asm) { a.label("x"); a.ld(0); a.jeq(0, "x", ""); a.ret(0) }},
		{"jump to itself", func(a *asm) { a.ld(0); a.label("x"); a.ja("x"); a.ret(0) }},
		{"label past the end", func(a *asm) { a.jeq(0, "x", ""); a.ret(0); a.label("x") }},
		{"ja without target", func(a *asm) { a.ja(""); a.ret(0) }},
		{"too long", func(a *asm) { padding(a, MaxInsns); a.ret(0) }},
		{"too long after trampolines", func(a *asm) {
			a.ld(0)
			for range 15 {
				a.jeq(0, "end", "")
				padding(a, 270)
			}
			padding(a, MaxInsns-1-15*271-1-5) // 5 short of the limit before the trampolines
			a.label("end")
			a.ret(0)
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var a asm
			tt.build(&a)
			if prog, err := a.assemble(); err == nil {
				t.Errorf("assemble() = %d instructions, nil error; want an error", len(prog))
			}
		})
	}
}

func TestAssembleErrorKind(t *testing.T) {
	var a asm
	a.jeq(0, "nowhere", "")
	a.ret(0)
	if _, err := a.assemble(); !errors.Is(err, errdefs.ErrInvalidArgument) {
		t.Errorf("assemble() = %v, want %v", err, errdefs.ErrInvalidArgument)
	}
}

// refRun runs a program as written, before assembly: labels are followed
// by name, so it shows what the assembled program must do.
func refRun(a *asm, data []byte) (uint32, error) {
	next := func(i int, label string) int {
		if label == "" {
			return i + 1
		}
		return a.labels[label]
	}
	var acc uint32
	for i := 0; i < len(a.items); {
		it := a.items[i]
		switch {
		case it.code == bpfLD|bpfW|bpfABS:
			acc = binary.LittleEndian.Uint32(data[it.k:])
			i++
		case it.code == bpfRET|bpfK:
			return it.k, nil
		case it.code == bpfJMP|bpfJA:
			i = next(i, it.ja)
		case it.code == bpfJMP|bpfJEQ|bpfK:
			if acc == it.k {
				i = next(i, it.jt)
			} else {
				i = next(i, it.jf)
			}
		default:
			return 0, fmt.Errorf("refRun: instruction %#x", it.code)
		}
	}
	return 0, errors.New("refRun: ran off the end")
}

// FuzzAssemble builds a random program of loads, equality jumps to random
// forward labels (many far away), unconditional jumps and returns, and
// checks the assembled program returns what the program as written does.
func FuzzAssemble(f *testing.F) {
	f.Add([]byte{0, 1, 2, 3, 4, 5, 6, 7}, uint32(0))
	f.Add([]byte{1, 200, 1, 7, 2, 255, 0, 0, 3, 9}, uint32(3))
	f.Fuzz(func(t *testing.T, ops []byte, in uint32) {
		if len(ops) > 40 { // with padding, at most 3,000 instructions
			ops = ops[:40]
		}
		var a asm
		// Label i names the instruction after op i; a jump from op i may
		// target any label from i on. Padding makes distances large.
		nlabels := len(ops)
		label := func(i int) string { return fmt.Sprint("L", i) }
		for i, op := range ops {
			target := label(i + int(op)%(nlabels-i))
			switch op % 4 {
			case 0:
				a.ld(0)
			case 1:
				a.jeq(uint32(op%7), target, "")
			case 2:
				a.jeq(uint32(op%5), "", target)
			case 3:
				a.ja(target)
			}
			padding(&a, int(op)%4*25)
			a.label(label(i))
		}
		a.ret(12345)
		prog, err := a.assemble()
		if err != nil {
			t.Fatalf("assemble() = %v", err)
		}
		data := binary.LittleEndian.AppendUint32(nil, in%8)
		want, err := refRun(&a, data)
		if err != nil {
			t.Fatal(err)
		}
		got, _, err := run(prog, data)
		if err != nil || got != want {
			t.Errorf("run(assembled, %d) = %d, %v; want %d", in%8, got, err, want)
		}
	})
}
