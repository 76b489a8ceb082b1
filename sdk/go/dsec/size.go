package dsec

import (
	"math"
	"math/big"
	"strconv"
	"strings"
)

// maxSizeLen bounds what ParseSize looks at, so that hostile input cannot
// make it work hard.
const maxSizeLen = 64

var sizeUnits = []struct {
	suffix string
	mult   int64
}{
	{"T", 1 << 40},
	{"G", 1 << 30},
	{"M", 1 << 20},
	{"K", 1 << 10},
}

// ParseSize parses a size in bytes as the CLI and the API take it: a number
// and an optional unit, K, M, G or T, all powers of 1024 ("512M" is 512 MiB,
// "2G" is 2 GiB), case-insensitive and optionally followed by "i", "iB" or
// "B" ("2GiB", "2gb"). Without a unit, or with "B" alone, the number is
// bytes and must be whole; with a unit it may have a fraction ("1.5G"),
// rounded down to whole bytes. Negative, too large, empty and malformed
// sizes are errors of kind ErrInvalidArgument.
func ParseSize(s string) (int64, error) {
	in := s
	s = strings.TrimSpace(s)
	switch {
	case s == "":
		return 0, sizeError(in, "is empty")
	case len(s) > maxSizeLen:
		return 0, sizeError(in[:maxSizeLen]+"…", "is too long")
	case s[0] == '-':
		return 0, sizeError(in, "is negative")
	}

	// Split the number from the unit.
	i := 0
	for i < len(s) && (s[i] >= '0' && s[i] <= '9' || s[i] == '.') {
		i++
	}
	num, unit := s[:i], asciiUpper(s[i:])
	whole, frac, hasDot := strings.Cut(num, ".")
	if whole == "" || (hasDot && (frac == "" || strings.Contains(frac, "."))) {
		return 0, sizeError(in, "is not a number with an optional unit")
	}

	mult := int64(1)
	if unit != "" && unit != "B" {
		found := false
		for _, u := range sizeUnits {
			rest, ok := strings.CutPrefix(unit, u.suffix)
			if ok && (rest == "" || rest == "B" || rest == "I" || rest == "IB") {
				mult, found = u.mult, true
				break
			}
		}
		if !found {
			return 0, sizeError(in, "has an unknown unit %q", s[i:])
		}
	}
	if mult == 1 && hasDot {
		return 0, sizeError(in, "is a fraction of a byte")
	}

	if !hasDot {
		n, err := strconv.ParseInt(whole, 10, 64)
		if err != nil || n > math.MaxInt64/mult {
			return 0, sizeError(in, "is too large")
		}
		return n * mult, nil
	}
	// value = whole.frac × mult, rounded down: (whole·10^d + frac)·mult / 10^d.
	scale := new(big.Int).Exp(big.NewInt(10), big.NewInt(int64(len(frac))), nil)
	v, _ := new(big.Int).SetString(whole+frac, 10)
	v.Mul(v, big.NewInt(mult))
	v.Quo(v, scale)
	if !v.IsInt64() {
		return 0, sizeError(in, "is too large")
	}
	return v.Int64(), nil
}

func sizeError(in, format string, args ...any) error {
	e := newError(ErrInvalidArgument, "size %q "+format, append([]any{in}, args...)...)
	e.Message += `: want a number and an optional unit K, M, G or T, powers of 1024, such as "512M" or "1.5G"`
	return e
}

// FormatSize formats n bytes for people, in the largest unit it reaches,
// the way ParseSize reads it: "512M", "2G", "100B". Sizes that are not a
// whole number of that unit show one decimal, rounded down ("1.5G",
// "1.0G" for a little over 1 GiB).
func FormatSize(n int64) string {
	if n < 0 {
		if n == math.MinInt64 {
			return strconv.FormatInt(n, 10) + "B"
		}
		return "-" + FormatSize(-n)
	}
	for _, u := range sizeUnits {
		if n < u.mult {
			continue
		}
		whole, rest := n/u.mult, n%u.mult
		if rest == 0 {
			return strconv.FormatInt(whole, 10) + u.suffix
		}
		tenth := rest * 10 / u.mult // no overflow: rest < mult ≤ 2^40
		return strconv.FormatInt(whole, 10) + "." + strconv.FormatInt(tenth, 10) + u.suffix
	}
	return strconv.FormatInt(n, 10) + "B"
}

// asciiUpper upper-cases ASCII letters only, so that no other script's
// letter passes for a unit.
func asciiUpper(s string) string {
	b := []byte(s)
	for i, c := range b {
		if 'a' <= c && c <= 'z' {
			b[i] = c - 'a' + 'A'
		}
	}
	return string(b)
}
