package seccomp

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strings"
	"testing"
)

// This file is a classic BPF interpreter for the tests: it checks a
// program as the kernel does before it accepts one (for the instructions
// the assembler emits) and runs it over a struct seccomp_data.

// seccompData is struct seccomp_data.
type seccompData struct {
	nr   uint32 // int in C; compared as unsigned by BPF
	arch uint32
	ip   uint64
	args [6]uint64
}

// bytes lays d out as the kernel does on a little-endian machine.
func (d seccompData) bytes() []byte {
	b := binary.LittleEndian.AppendUint32(nil, d.nr)
	b = binary.LittleEndian.AppendUint32(b, d.arch)
	b = binary.LittleEndian.AppendUint64(b, d.ip)
	for _, a := range d.args {
		b = binary.LittleEndian.AppendUint64(b, a)
	}
	return b
}

// call returns the seccomp_data of a native call of arch.
func call(arch Arch, name string, args ...uint64) seccompData {
	info := arches[arch]
	nr, ok := info.nr[name]
	if !ok {
		panic(fmt.Sprintf("no system call %q on %s", name, arch))
	}
	d := seccompData{nr: nr, arch: info.audit, ip: 0x401000}
	copy(d.args[:], args)
	return d
}

// decode parses an encoded filter.
func decode(b []byte) ([]insn, error) {
	if len(b)%insnSize != 0 {
		return nil, fmt.Errorf("filter of %d bytes is not a whole number of instructions", len(b))
	}
	prog := make([]insn, len(b)/insnSize)
	for i := range prog {
		p := b[i*insnSize:]
		prog[i] = insn{code: binary.LittleEndian.Uint16(p), jt: p[2], jf: p[3], k: binary.LittleEndian.Uint32(p[4:])}
	}
	return prog, nil
}

// check rejects what the kernel's bpf_check_classic and seccomp's checker
// would reject, among programs made of the instructions the assembler
// emits, and every other instruction.
func check(prog []insn) error {
	n := len(prog)
	if n == 0 || n > MaxInsns {
		return fmt.Errorf("length %d is not 1 to %d", n, MaxInsns)
	}
	for pc, in := range prog {
		switch in.code {
		case bpfLD | bpfW | bpfABS:
			if in.k%4 != 0 || in.k >= 64 {
				return fmt.Errorf("%d: load of offset %d outside struct seccomp_data or unaligned", pc, in.k)
			}
		case bpfALU | bpfAND | bpfK, bpfRET | bpfK:
		case bpfJMP | bpfJA:
			if uint64(in.k) >= uint64(n-pc-1) {
				return fmt.Errorf("%d: ja %d past the end", pc, in.k)
			}
		case bpfJMP | bpfJEQ | bpfK, bpfJMP | bpfJGT | bpfK, bpfJMP | bpfJGE | bpfK, bpfJMP | bpfJSET | bpfK:
			if pc+1+int(in.jt) >= n || pc+1+int(in.jf) >= n {
				return fmt.Errorf("%d: jump past the end", pc)
			}
		default:
			return fmt.Errorf("%d: instruction %#x not allowed", pc, in.code)
		}
	}
	if prog[n-1].code != bpfRET|bpfK {
		return errors.New("the last instruction is not a ret")
	}
	return nil
}

// run checks prog and runs it over data. It returns the value of the ret
// that ended it and how many instructions it ran.
func run(prog []insn, data []byte) (ret uint32, steps int, err error) {
	if err := check(prog); err != nil {
		return 0, 0, err
	}
	var a uint32
	for pc := 0; ; pc++ {
		steps++
		in := prog[pc]
		switch in.code {
		case bpfLD | bpfW | bpfABS:
			if int(in.k)+4 > len(data) {
				return 0, steps, fmt.Errorf("%d: load past the data", pc)
			}
			a = binary.LittleEndian.Uint32(data[in.k:])
		case bpfALU | bpfAND | bpfK:
			a &= in.k
		case bpfRET | bpfK:
			return in.k, steps, nil
		case bpfJMP | bpfJA:
			pc += int(in.k)
		default:
			var taken bool
			switch in.code &^ (bpfJMP | bpfK) {
			case bpfJEQ:
				taken = a == in.k
			case bpfJGT:
				taken = a > in.k
			case bpfJGE:
				taken = a >= in.k
			case bpfJSET:
				taken = a&in.k != 0
			}
			if taken {
				pc += int(in.jt)
			} else {
				pc += int(in.jf)
			}
		}
	}
}

// runFilter runs an encoded filter over d and returns its action.
func runFilter(t testing.TB, filter []byte, d seccompData) Action {
	t.Helper()
	prog, err := decode(filter)
	if err != nil {
		t.Fatal(err)
	}
	ret, _, err := run(prog, d.bytes())
	if err != nil {
		t.Fatalf("run filter: %v", err)
	}
	return Action(ret)
}

// disasm prints prog one instruction a line, with absolute jump targets and
// the names of the system calls and fields it compares.
func disasm(prog []insn, arch Arch) string {
	names := map[uint32]string{}
	for n, nr := range arches[arch].nr {
		names[nr] = n
	}
	fields := map[uint32]string{offNr: "nr", offArch: "arch"}
	for i := range 6 {
		fields[argLow(i)] = fmt.Sprintf("args[%d] low", i)
		fields[argLow(i)+4] = fmt.Sprintf("args[%d] high", i)
	}
	var b strings.Builder
	var loaded uint32
	for pc, in := range prog {
		fmt.Fprintf(&b, "%4d: ", pc)
		switch in.code {
		case bpfLD | bpfW | bpfABS:
			loaded = in.k
			fmt.Fprintf(&b, "ld [%d]  ; %s", in.k, fields[in.k])
		case bpfALU | bpfAND | bpfK:
			fmt.Fprintf(&b, "and #%#x", in.k)
		case bpfRET | bpfK:
			fmt.Fprintf(&b, "ret %v", Action(in.k))
		case bpfJMP | bpfJA:
			fmt.Fprintf(&b, "ja %d", pc+1+int(in.k))
		default:
			op := map[uint16]string{bpfJEQ: "jeq", bpfJGT: "jgt", bpfJGE: "jge", bpfJSET: "jset"}[in.code&^(bpfJMP|bpfK)]
			fmt.Fprintf(&b, "%s #%#x, %d, %d", op, in.k, pc+1+int(in.jt), pc+1+int(in.jf))
			if loaded == offNr && op == "jeq" && names[in.k] != "" {
				fmt.Fprintf(&b, "  ; %s", names[in.k])
			}
		}
		b.WriteByte('\n')
	}
	return b.String()
}

func TestRunChecks(t *testing.T) {
	ret := insn{code: bpfRET | bpfK}
	tests := []struct {
		name string
		prog []insn
	}{
		{"empty", nil},
		{"no ret at the end", []insn{{code: bpfLD | bpfW | bpfABS}}},
		{"unaligned load", []insn{{code: bpfLD | bpfW | bpfABS, k: 2}, ret}},
		{"load past seccomp_data", []insn{{code: bpfLD | bpfW | bpfABS, k: 64}, ret}},
		{"jump past the end", []insn{{code: bpfJMP | bpfJEQ | bpfK, jt: 1}, ret}},
		{"ja past the end", []insn{{code: bpfJMP | bpfJA, k: 1}, ret}},
		{"unknown instruction", []insn{{code: 0x07}, ret}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, _, err := run(tt.prog, make([]byte, 64)); err == nil {
				t.Errorf("run(%v) = nil error, want one", tt.prog)
			}
		})
	}
}
