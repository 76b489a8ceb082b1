package sandboxfs

import (
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestClean(t *testing.T) {
	long := "/" + strings.Repeat("a/", (MaxPathLen-1)/2) // 4095 bytes
	tests := []struct {
		in      string
		want    string
		wantErr error
	}{
		{in: "/", want: "."},
		{in: ".", want: "."},
		{in: "..", want: "."},
		{in: "/..", want: "."},
		{in: "/etc/shadow", want: "etc/shadow"},
		{in: "etc/shadow", want: "etc/shadow"},
		{in: "/../../etc/shadow", want: "etc/shadow"},
		{in: "a/../../../etc/shadow", want: "etc/shadow"},
		{in: "//a//b/", want: "a/b"},
		{in: "a/./b/../c", want: "a/c"},
		{in: "x/etc/shadow", want: "x/etc/shadow"},
		{in: "-rf", want: "-rf"},
		{in: "a b/\tc\n", want: "a b/\tc\n"},
		{in: "...", want: "..."},
		{in: long, want: strings.TrimSuffix(long[1:], "/")},
		{in: strings.Repeat("b", MaxPathLen), want: strings.Repeat("b", MaxPathLen)},
		{in: "", wantErr: errdefs.ErrInvalidArgument},
		{in: "a\x00b", wantErr: errdefs.ErrInvalidArgument},
		{in: "\x00", wantErr: errdefs.ErrInvalidArgument},
		{in: strings.Repeat("b", MaxPathLen+1), wantErr: errdefs.ErrInvalidArgument},
	}
	for _, tt := range tests {
		got, err := Clean(tt.in)
		if tt.wantErr != nil {
			if errdefs.Kind(err) != tt.wantErr {
				t.Errorf("Clean(%.40q) = %q, %v, want kind %v", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("Clean(%.40q) = %.40q, %v, want %.40q", tt.in, got, err, tt.want)
		}
	}
}

func FuzzClean(f *testing.F) {
	for _, s := range []string{"/", "", ".", "..", "/etc/shadow", "/../../x", "a//b/./c/..", "a\x00", "x/../../y", strings.Repeat("/..", 1400)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		got, err := Clean(p)
		invalid := p == "" || len(p) > MaxPathLen || strings.ContainsRune(p, 0)
		if err != nil {
			if !invalid || errdefs.Kind(err) != errdefs.ErrInvalidArgument {
				t.Fatalf("Clean(%q) = %v, want no error", p, err)
			}
			return
		}
		if invalid {
			t.Fatalf("Clean(%q) = %q, want an InvalidArgument error", p, got)
		}
		if got == "" || len(got) > len(p) || strings.ContainsRune(got, 0) {
			t.Fatalf("Clean(%q) = %q: empty, longer than the input or with NUL", p, got)
		}
		if got != "." {
			for _, e := range strings.Split(got, "/") {
				if e == "" || e == "." || e == ".." {
					t.Fatalf("Clean(%q) = %q: element %q", p, got, e)
				}
			}
		}
		for _, again := range []string{got, "/" + got} {
			if g2, err := Clean(again); err != nil || g2 != got {
				t.Fatalf("Clean(%q) = %q, %v, want %q (Clean(%q) = %q)", again, g2, err, got, p, got)
			}
		}
	})
}
