package sandbox

import (
	"crypto/rand"
	"strings"

	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// A sandbox ID is the name of the node that owns it, a dash and 12 random
// base32 characters: lowercase, a DNS label, at most 53 characters
// (CONTRACT.md). Any apiserver routes a request by the node it names.

var nodeNameRe = lazyregexp.New(`^[a-z0-9]([a-z0-9-]{0,38}[a-z0-9])?$`)

// ValidNodeName reports whether s can name a node.
func ValidNodeName(s string) bool { return nodeNameRe.MatchString(s) }

const (
	idAlphabet = "abcdefghijklmnopqrstuvwxyz234567"
	idRandLen  = 12
)

// NewID makes a new sandbox ID on node.
func NewID(node string) string { return node + "-" + RandomString(idRandLen) }

// RandomString returns n random characters of the ID alphabet
// (lowercase letters and digits 2-7).
func RandomString(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		panic(err) // crypto/rand does not fail on Linux
	}
	for i := range b {
		b[i] = idAlphabet[int(b[i])%len(idAlphabet)]
	}
	return string(b)
}

// NodeOfID returns the node that owns a sandbox ID.
func NodeOfID(id string) (string, bool) {
	i := strings.LastIndexByte(id, '-')
	if i <= 0 || len(id)-i-1 != idRandLen || len(id) > 63 {
		return "", false
	}
	for _, c := range id[i+1:] {
		if !strings.ContainsRune(idAlphabet, c) {
			return "", false
		}
	}
	node := id[:i]
	return node, ValidNodeName(node)
}

// A rollout ID is the name of the node that owns the rollout (and all its
// members), "-r-" and 12 random characters of the same alphabet: at most
// 55 characters, a DNS label and a label value. Any apiserver routes a
// request by the node it names.

// NewRolloutID makes a new rollout ID on node.
func NewRolloutID(node string) string { return node + "-r-" + RandomString(idRandLen) }

// NodeOfRolloutID returns the node that owns a rollout ID.
func NodeOfRolloutID(id string) (string, bool) {
	if len(id) > 63 || len(id) < idRandLen+4 {
		return "", false
	}
	for _, c := range id[len(id)-idRandLen:] {
		if !strings.ContainsRune(idAlphabet, c) {
			return "", false
		}
	}
	node, ok := strings.CutSuffix(id[:len(id)-idRandLen], "-r-")
	if !ok {
		return "", false
	}
	return node, ValidNodeName(node)
}
