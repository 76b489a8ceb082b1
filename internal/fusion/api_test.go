package fusion

import (
	"encoding/base64"
	"errors"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func ptr[T any](v T) *T { return &v }

func TestParseRequest(t *testing.T) {
	tests := []struct {
		name string
		body string
		want *RunCodeRequest
		err  string
	}{
		{
			name: "defaults",
			body: `{"code": "print(1)", "language": "python"}`,
			want: &RunCodeRequest{Code: "print(1)", Language: "python", CompileTimeout: 10, RunTimeout: 10, MemoryLimitMB: -1},
		},
		{
			name: "every field",
			body: `{"code": "x", "language": "go", "compile_timeout": 2.5, "run_timeout": 1, "memory_limit_MB": 256,
				"stdin": "in", "files": {"a.txt": "aGk=", "skip": null}, "fetch_files": ["out.txt"], "args": ["-q"],
				"unknown_field": 1}`,
			want: &RunCodeRequest{
				Code: "x", Language: "go", CompileTimeout: 2.5, RunTimeout: 1, MemoryLimitMB: 256,
				Stdin: ptr("in"), Files: map[string]*string{"a.txt": ptr("aGk="), "skip": nil},
				FetchFiles: []string{"out.txt"}, Args: []string{"-q"},
			},
		},
		{
			name: "nulls take the defaults",
			body: `{"code": "", "language": "bash", "run_timeout": null, "stdin": null, "files": null}`,
			want: &RunCodeRequest{Language: "bash", CompileTimeout: 10, RunTimeout: 10, MemoryLimitMB: -1},
		},
		{name: "no code", body: `{"language": "python"}`, err: `field "code" is required`},
		{name: "null language", body: `{"code": "x", "language": null}`, err: `field "language" is required`},
		{name: "not an object", body: `[1]`, err: "not a JSON object"},
		{name: "trailing data", body: `{"code": "x", "language": "python"} {}`, err: "data after"},
		{name: "timeout is a string", body: `{"code": "x", "language": "python", "run_timeout": "ten"}`, err: `field "run_timeout": got a JSON string`},
		{name: "files is a list", body: `{"code": "x", "language": "python", "files": ["a"]}`, err: `field "files"`},
		{name: "empty", body: ``, err: "not a JSON object"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseRequest(strings.NewReader(tt.body))
			if tt.err != "" {
				var re *RequestError
				if err == nil || !errors.As(err, &re) || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("ParseRequest(%s) = %+v, %v; want a RequestError with %q", tt.body, got, err, tt.err)
				}
				return
			}
			if err != nil {
				t.Fatalf("ParseRequest(%s) = %v", tt.body, err)
			}
			if d := cmp.Diff(tt.want, got); d != "" {
				t.Errorf("ParseRequest(%s) (-want +got):\n%s", tt.body, d)
			}
		})
	}
}

func TestCleanPath(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"a.txt", "a.txt", true},
		{"dir/b.txt", "dir/b.txt", true},
		{"./dir//c", "dir/c", true},
		{"dir/../d", "d", true},
		{"a/b/../../e", "e", true},
		{"", "", false},
		{".", "", false},
		{"..", "", false},
		{"../x", "", false},
		{"a/../../x", "", false},
		{"/etc/passwd", "", false},
		{"/workspace/a", "", false},
		{"a\x00b", "", false},
		{"\xff", "", false},
		{strings.Repeat("a", MaxPathLength+1), "", false},
	}
	for _, tt := range tests {
		got, err := CleanPath(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("CleanPath(%q) = %q, %v; want %q, ok=%v", tt.in, got, err, tt.want, tt.ok)
		}
	}
}

func TestInputFiles(t *testing.T) {
	b64 := func(s string) *string { return ptr(base64.StdEncoding.EncodeToString([]byte(s))) }
	got, err := InputFiles(map[string]*string{
		"b/c.txt":                b64("c"),
		"a.txt":                  b64("a"),
		"none":                   nil,
		"x_IGNORE_THIS_FILE_y":   b64("ignored"),
		"./d/../e.bin":           b64("\x00\x01"),
		"IGNORE_THIS_FILE/../..": b64("even a bad path is ignored"),
	})
	if err != nil {
		t.Fatal(err)
	}
	// In the order of the request's names: "./d/../e.bin" sorts first.
	want := []File{{"e.bin", []byte{0, 1}}, {"a.txt", []byte("a")}, {"b/c.txt", []byte("c")}}
	if d := cmp.Diff(want, got); d != "" {
		t.Errorf("InputFiles (-want +got):\n%s", d)
	}
	for name, files := range map[string]map[string]*string{
		"outside":        {"../etc/passwd": b64("x")},
		"absolute":       {"/etc/passwd": b64("x")},
		"not base64":     {"a": ptr("!!!")},
		"same path":      {"a": b64("1"), "./a": b64("2")},
		"file and dir":   {"a": b64("1"), "a/b": b64("2")},
		"the dir itself": {".": b64("1")},
	} {
		if got, err := InputFiles(files); err == nil {
			t.Errorf("InputFiles(%s) = %v, want an error", name, got)
		}
	}
}

func TestFetchPaths(t *testing.T) {
	got, err := FetchPaths([]string{"out.txt", "d/../r.json"})
	if err != nil || !cmp.Equal(got, []string{"out.txt", "r.json"}) {
		t.Errorf("FetchPaths = %v, %v", got, err)
	}
	if _, err := FetchPaths([]string{"ok", "../../etc/shadow"}); err == nil || !strings.Contains(err.Error(), "outside the working directory") {
		t.Errorf("FetchPaths(../../etc/shadow) = %v, want refused", err)
	}
}

func TestOutcome(t *testing.T) {
	rc := func(n int) *CommandRunResult { return &CommandRunResult{Status: CommandFinished, ReturnCode: ptr(n)} }
	tle := &CommandRunResult{Status: CommandTimeLimitExceeded}
	errRes := &CommandRunResult{Status: CommandError, Stderr: ptr("boom")}
	tests := []struct {
		name         string
		compile, run *CommandRunResult
		want         RunStatus
		msg          string
	}{
		{"run ok", nil, rc(0), StatusSuccess, ""},
		{"run fails", nil, rc(1), StatusFailed, ""},
		{"signal", nil, rc(-9), StatusFailed, ""},
		{"run timeout", nil, tle, StatusFailed, ""},
		{"compile and run ok", rc(0), rc(0), StatusSuccess, ""},
		{"compile fails", rc(2), nil, StatusFailed, ""},
		{"compile timeout", tle, nil, StatusFailed, ""},
		{"platform error", nil, errRes, StatusSandboxError, "boom"},
		{"error wins over timeout", tle, errRes, StatusSandboxError, "boom"},
		{"nothing ran", nil, nil, StatusSuccess, ""},
	}
	for _, tt := range tests {
		st, msg := Outcome(tt.compile, tt.run)
		if st != tt.want || msg != tt.msg {
			t.Errorf("%s: Outcome = %s, %q; want %s, %q", tt.name, st, msg, tt.want, tt.msg)
		}
	}
}

func FuzzParseRequest(f *testing.F) {
	f.Add(`{"code": "print(1)", "language": "python", "files": {"a/b": "aGk="}, "fetch_files": ["x"]}`)
	f.Add(`{"code": "", "language": "go", "run_timeout": 1e309}`)
	f.Add(`{"code": "x", "language": "bash", "files": {"../a": null}}`)
	f.Fuzz(func(t *testing.T, body string) {
		req, err := ParseRequest(strings.NewReader(body))
		if err != nil {
			var re *RequestError
			if !errors.As(err, &re) {
				t.Fatalf("ParseRequest error %v is not a RequestError", err)
			}
			return
		}
		files, err := InputFiles(req.Files)
		if err == nil {
			for _, f := range files {
				checkInside(t, f.Path)
			}
		}
		if paths, err := FetchPaths(req.FetchFiles); err == nil {
			for _, p := range paths {
				checkInside(t, p)
			}
		}
	})
}

func FuzzCleanPath(f *testing.F) {
	for _, s := range []string{"a", "a/b", "../a", "/a", "a/../..", "./././a//b/", "..a", "a/..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		c, err := CleanPath(p)
		if err != nil {
			return
		}
		checkInside(t, c)
		if c2, err := CleanPath(c); err != nil || c2 != c {
			t.Errorf("CleanPath(%q) = %q, not a fixed point: CleanPath again = %q, %v", p, c, c2, err)
		}
	})
}

// checkInside fails unless p is a clean relative path below the working
// directory.
func checkInside(t *testing.T, p string) {
	t.Helper()
	if p == "" || p == "." || strings.HasPrefix(p, "/") || p == ".." || strings.HasPrefix(p, "../") ||
		strings.Contains(p, "/../") || strings.HasSuffix(p, "/..") || strings.Contains(p, "\x00") {
		t.Errorf("path %q leaves the working directory", p)
	}
}
