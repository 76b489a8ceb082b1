package cluster

import (
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/lazyregexp"
)

// DefaultTag is the tag of a reference that names none.
const DefaultTag = "latest"

// MaxNameLength is the longest image name ParseRef accepts.
const MaxNameLength = 128

// Ref names an image or environment: NAME:TAG.
type Ref struct {
	Name string
	Tag  string
}

// String returns NAME:TAG.
func (r Ref) String() string { return r.Name + ":" + r.Tag }

// The grammar of references, after Docker's.
//
//	component := [a-z0-9]+ (separator [a-z0-9]+)*   separator := '.' | '_' | '__' | '-'
//	name      := [component [':' port] '/'] component ('/' component)*
//	tag       := [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}
//
// The optional port lets a registry-style name (localhost:5000/app) through
// as a name instead of misreading "5000/app" as a tag.
const refComponent = `[a-z0-9]+(?:(?:__|[._-])[a-z0-9]+)*`

var (
	nameRE = lazyregexp.New(`^(?:` + refComponent + `(?::[0-9]{1,5})?/)?` + refComponent + `(?:/` + refComponent + `)*$`)
	tagRE  = lazyregexp.New(`^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$`)
)

// ParseRef parses NAME[:TAG]; the tag defaults to DefaultTag. Errors are
// InvalidArgument and say what a valid reference looks like.
func ParseRef(s string) (Ref, error) {
	if s == "" {
		return Ref{}, errdefs.Newf(errdefs.ErrInvalidArgument, "empty image reference: give NAME or NAME:TAG")
	}
	if strings.Contains(s, "@") {
		return Ref{}, errdefs.Newf(errdefs.ErrInvalidArgument,
			"invalid image reference %.80q: references by digest are not supported; use NAME:TAG", s)
	}
	r := Ref{Name: s, Tag: DefaultTag}
	// A ':' followed by a '/' belongs to a registry host's port, not a tag.
	if i := strings.LastIndexByte(s, ':'); i >= 0 && !strings.Contains(s[i+1:], "/") {
		r.Name, r.Tag = s[:i], s[i+1:]
	}
	if err := r.validate(); err != nil {
		return Ref{}, errdefs.Newf(errdefs.ErrInvalidArgument, "invalid image reference %.80q: %v", s, err)
	}
	return r, nil
}

// validate checks an already split reference; its error is the reason only.
func (r Ref) validate() error {
	switch {
	case r.Name == "":
		return errorString("empty name")
	case len(r.Name) > MaxNameLength:
		return errorString("name longer than 128 characters")
	case !nameRE.MatchString(r.Name):
		return errorString("the name must be lowercase letters and digits, in components joined by '/', " +
			"each component separated inside by one '.', '_', '__' or '-'")
	case r.Tag == "":
		return errorString("empty tag after ':'")
	case !tagRE.MatchString(r.Tag):
		return errorString("the tag must be at most 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'")
	}
	return nil
}

type errorString string

func (e errorString) Error() string { return string(e) }
