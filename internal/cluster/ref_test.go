package cluster

import (
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func TestParseRef(t *testing.T) {
	t.Parallel()
	long := strings.Repeat("a", MaxNameLength)
	tests := []struct {
		in      string
		want    Ref
		wantErr bool
	}{
		{in: "python", want: Ref{"python", "latest"}},
		{in: "python:3.12", want: Ref{"python", "3.12"}},
		{in: "library/python:3.12-slim", want: Ref{"library/python", "3.12-slim"}},
		{in: "docker.io/library/python", want: Ref{"docker.io/library/python", "latest"}},
		{in: "a__b/c_d/e-f.g", want: Ref{"a__b/c_d/e-f.g", "latest"}},
		{in: "app:_V1.0-rc", want: Ref{"app", "_V1.0-rc"}},
		{in: "app:" + strings.Repeat("t", 128), want: Ref{"app", strings.Repeat("t", 128)}},
		{in: long, want: Ref{long, "latest"}},
		// A ':' before a '/' is a registry port, not a tag.
		{in: "localhost:5000/app", want: Ref{"localhost:5000/app", "latest"}},
		{in: "localhost:5000/team/app:v2", want: Ref{"localhost:5000/team/app", "v2"}},
		// Versioned layer and environment names (issue 6).
		{in: "base/py310:3", want: Ref{"base/py310", "3"}},
		{in: "ws/sphinx-9658:1", want: Ref{"ws/sphinx-9658", "1"}},
		{in: "tk/harness:12", want: Ref{"tk/harness", "12"}},
		{in: "ws/sphinx-9658", want: Ref{"ws/sphinx-9658", "latest"}},

		{in: "", wantErr: true},
		{in: ":v1", wantErr: true},
		{in: "app:", wantErr: true},
		{in: "App", wantErr: true},
		{in: "app:v1:v2", wantErr: true},
		{in: "app:.v1", wantErr: true},
		{in: "app:-v1", wantErr: true},
		{in: "app:" + strings.Repeat("t", 129), wantErr: true},
		{in: long + "a", wantErr: true},
		{in: "a--b", wantErr: true},
		{in: "a___b", wantErr: true},
		{in: "a..b", wantErr: true},
		{in: "-app", wantErr: true},
		{in: "app-", wantErr: true},
		{in: "/app", wantErr: true},
		{in: "app/", wantErr: true},
		{in: "a//b", wantErr: true},
		{in: "app@sha256:" + strings.Repeat("a", 64), wantErr: true},
		{in: "app:5000/x:y/z", wantErr: true},
		{in: "a/b:5000/c", wantErr: true}, // a port only on the first component
		{in: "localhost:/app", wantErr: true},
		{in: "localhost:123456/app", wantErr: true},
		{in: "localhost:5000", want: Ref{"localhost", "5000"}},
		{in: "app:v 1", wantErr: true},
		{in: "äpp", wantErr: true},
	}
	for _, tt := range tests {
		got, err := ParseRef(tt.in)
		if tt.wantErr {
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Errorf("ParseRef(%q) = %+v, %v, want InvalidArgument", tt.in, got, err)
			}
			continue
		}
		if err != nil || got != tt.want {
			t.Errorf("ParseRef(%q) = %+v, %v, want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestRefString(t *testing.T) {
	t.Parallel()
	if got := (Ref{Name: "localhost:5000/app", Tag: "v1"}).String(); got != "localhost:5000/app:v1" {
		t.Errorf("String() = %q, want %q", got, "localhost:5000/app:v1")
	}
}

func FuzzParseRef(f *testing.F) {
	for _, s := range []string{
		"python", "python:3.12", "localhost:5000/team/app:v2", "a__b/c.d-e:_x",
		"App", "app:", ":", "a//b", "app@sha256:00", "x:1/y:2", strings.Repeat("a/", 70),
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseRef(s)
		if err != nil {
			if !errdefs.Is(err, errdefs.ErrInvalidArgument) {
				t.Fatalf("ParseRef(%q) = %v, want InvalidArgument", s, err)
			}
			return
		}
		if r.Name == "" || len(r.Name) > MaxNameLength || r.Tag == "" || len(r.Tag) > 128 {
			t.Fatalf("ParseRef(%q) = %+v, out of bounds", s, r)
		}
		if s != r.String() && s+":"+DefaultTag != r.String() {
			t.Fatalf("ParseRef(%q).String() = %q, want the input with at most a default tag", s, r.String())
		}
		again, err := ParseRef(r.String())
		if err != nil || again != r {
			t.Fatalf("ParseRef(%q) = %+v, %v, want %+v (round trip of %q)", r.String(), again, err, r, s)
		}
	})
}

func TestParseRefMessages(t *testing.T) {
	t.Parallel()
	tests := []struct{ in, want string }{
		{"Base/py310:3", "lowercase letters and digits"},
		{"base/py310:", "empty tag"},
		{"tk/harness:-12", "not starting with '.' or '-'"},
		{"ws//sphinx:1", "components joined by '/'"},
		{"base/py310@sha256:00", "use NAME:TAG"},
		{"", "give NAME or NAME:TAG"},
	}
	for _, tt := range tests {
		_, err := ParseRef(tt.in)
		if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), tt.want) ||
			(tt.in != "" && !strings.Contains(err.Error(), tt.in)) {
			t.Errorf("ParseRef(%q) = %v, want InvalidArgument naming the input and saying %q", tt.in, err, tt.want)
		}
	}
}
