// Package lazyregexp is a regular expression compiled on its first use.
//
// The dsec binary holds the server and the command-line client, so every
// package-level pattern of a server package used to be compiled at the
// start of every CLI command, even those that never match anything (a
// pattern with counted repetitions such as {0,251} takes a fraction of a
// millisecond each). A *Regexp declared at package level costs nothing
// until its first match.
//
// A bad pattern panics at its first use, as regexp.MustCompile does at
// start; the tests of the package that declares it find it there.
package lazyregexp

import (
	"regexp"
	"sync"
)

// Regexp is a regular expression compiled on first use. It is safe for
// concurrent use.
type Regexp struct {
	expr string
	once sync.Once
	re   *regexp.Regexp // set once by once
}

// New returns the pattern expr, compiled by its first use. A pattern that
// does not compile panics there, as regexp.MustCompile does.
func New(expr string) *Regexp {
	return &Regexp{expr: expr}
}

func (r *Regexp) compiled() *regexp.Regexp {
	r.once.Do(func() { r.re = regexp.MustCompile(r.expr) })
	return r.re
}

// MatchString reports whether s contains a match of the pattern.
func (r *Regexp) MatchString(s string) bool { return r.compiled().MatchString(s) }

// String returns the pattern's source text.
func (r *Regexp) String() string { return r.expr }
