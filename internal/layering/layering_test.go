package layering

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// modules are the directories of dsec's modules, relative to the
// repository's root, with their module paths.
var modules = []struct{ dir, path string }{
	{".", Module},
	{"api", Module + "/api"},
	{"sdk/go", Module + "/sdk/go"},
}

// listedPackage is what the test reads of `go list -json`.
type listedPackage struct {
	ImportPath   string
	Imports      []string
	TestImports  []string
	XTestImports []string
	Module       *struct{ Path string }
	DepOnly      bool
}

// goCmd returns a go command run in dir with GOWORK=off (each module on
// its own, as a user or CI builds it), or skips the test without go.
func goCmd(t *testing.T, dir string, args ...string) *exec.Cmd {
	t.Helper()
	gobin, err := exec.LookPath("go")
	if err != nil {
		t.Skipf("no go command on PATH: %v", err)
	}
	cmd := exec.Command(gobin, args...)
	cmd.Dir = dir
	cmd.Env = append(os.Environ(), "GOWORK=off")
	return cmd
}

// run runs cmd and returns its standard output, failing the test with its
// standard error.
func run(t *testing.T, cmd *exec.Cmd) []byte {
	t.Helper()
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("%s (in %s): %v\n%s", strings.Join(cmd.Args, " "), cmd.Dir, err, stderr.Bytes())
	}
	return out
}

// repoRoot returns the directory of the server's go.mod.
func repoRoot(t *testing.T) string {
	t.Helper()
	gomod := strings.TrimSpace(string(run(t, goCmd(t, ".", "env", "GOMOD"))))
	if gomod == "" || gomod == os.DevNull {
		t.Skip("not inside the dsec module")
	}
	return filepath.Dir(gomod)
}

// ours returns p relative to Module, and whether it is one of our packages.
func ours(p string) (string, bool) {
	if p == Module {
		return "", true
	}
	rel, ok := strings.CutPrefix(p, Module+"/")
	return rel, ok
}

// matches reports whether the relative import path rel matches pattern,
// and how specific the match is (the pattern's length).
func matches(pattern, rel string) (int, bool) {
	if base, ok := strings.CutSuffix(pattern, "/..."); ok {
		if rel == base || strings.HasPrefix(rel, base+"/") {
			return len(base), true
		}
		return 0, false
	}
	return len(pattern), rel == pattern
}

// layerOf returns the index in layers of rel's layer, or -1.
func layerOf(rel string) int {
	best, bestLen := -1, -1
	for i, l := range layers {
		for _, p := range l.pkgs {
			if n, ok := matches(p, rel); ok && n > bestLen {
				best, bestLen = i, n
			}
		}
	}
	return best
}

// checkImport returns what is wrong with rel importing dep (both relative
// to Module), or "". test says the import is a test's.
func checkImport(rel, dep string, test bool) string {
	from, to := layerOf(rel), layerOf(dep)
	if to < 0 {
		return fmt.Sprintf("%s is in no layer: add it to the table in layering.go", dep)
	}
	if to > from {
		return fmt.Sprintf("layer %q may not import layer %q above it", layers[from].name, layers[to].name)
	}
	if test {
		return "" // a test may wire in what its package may not (a fake, say)
	}
	for _, r := range forbidden {
		if _, ok := matches(r.from, rel); !ok {
			continue
		}
		if _, ok := matches(r.to, dep); ok {
			return "forbidden: " + r.why
		}
	}
	return ""
}

// violations returns one line per import of pkgs that breaks the rules.
func violations(pkgs []listedPackage) []string {
	var out []string
	for _, p := range pkgs {
		rel, ok := ours(p.ImportPath)
		if !ok {
			continue
		}
		if layerOf(rel) < 0 {
			out = append(out, fmt.Sprintf("%s is in no layer: add it to the table in layering.go", rel))
			continue
		}
		check := func(imports []string, test bool) {
			for _, imp := range imports {
				dep, ok := ours(imp)
				if !ok || imp == p.ImportPath {
					continue
				}
				if why := checkImport(rel, dep, test); why != "" {
					what := "imports"
					if test {
						what = "has a test that imports"
					}
					out = append(out, fmt.Sprintf("%s %s %s: %s", rel, what, dep, why))
				}
			}
		}
		check(p.Imports, false)
		check(slices.Concat(p.TestImports, p.XTestImports), true)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// listPackages returns the packages of the module in dir and everything
// they import, tests included.
func listPackages(t *testing.T, dir string) []listedPackage {
	t.Helper()
	// -e: a package that does not build (its own test says so) still
	// shows its imports.
	out := run(t, goCmd(t, dir, "list", "-e", "-deps", "-test", "-json=ImportPath,Imports,TestImports,XTestImports,Module,DepOnly", "./..."))
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for {
		var p listedPackage
		err := dec.Decode(&p)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			t.Fatalf("go list output: %v", err)
		}
		// -test adds test variants ("p [p.test]") and test mains
		// ("p.test"); their imports are those of p and its tests.
		if strings.HasSuffix(p.ImportPath, ".test") || strings.Contains(p.ImportPath, " ") {
			continue
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

// TestImportDirections holds every package of the three modules, and every
// test, to the layers and the forbidden imports of layering.go.
func TestImportDirections(t *testing.T) {
	root := repoRoot(t)
	var all []listedPackage
	for _, m := range modules {
		pkgs := listPackages(t, filepath.Join(root, m.dir))
		n := 0
		for _, p := range pkgs {
			if p.Module != nil && p.Module.Path == m.path && !p.DepOnly {
				n++
			}
		}
		if n == 0 {
			t.Errorf("go list found no package of %s in %s", m.path, m.dir)
		}
		all = append(all, pkgs...)
	}
	for _, v := range violations(all) {
		t.Error(v)
	}
}

// TestRules checks the checker: an import upwards, a forbidden one, a
// package in no layer, and imports that are fine.
func TestRules(t *testing.T) {
	tests := []struct {
		from, to string
		test     bool
		want     string // a substring of the complaint; "" for none
	}{
		{"internal/keeper", "internal/edge", false, `layer "keeper" may not import layer "edge" above it`},
		{"sdk/go/dsec", "internal/errdefs", false, `layer "sdk" may not import layer "base"`},
		{"api/dsec/sandbox/v1", "sdk/go/dsec", false, `layer "api" may not import layer "sdk"`},
		{"internal/edge", "internal/cluster", false, `layer "edge" may not import layer "control plane"`},
		{"internal/edge", "internal/keeper", false, "forbidden: only a backend talks to the keeper"},
		{"internal/edge", "internal/edge/backend/container", false, "forbidden: the edge knows backends only"},
		{"internal/edge", "internal/edge/backend/container", true, ""},
		{"internal/edge", "internal/nosuch", false, "internal/nosuch is in no layer"},
		{"internal/edge/backend/container", "internal/keeper", false, ""},
		{"internal/edge", "internal/sandbox", false, ""},
		{"internal/keeper", "internal/sandbox", false, ""},
		{"internal/apiserver", "internal/edge", false, "forbidden: the API server reaches edges through the node API"},
		{"internal/apiserver", "internal/caller", false, ""},
		{"internal/server", "sdk/go/dsec", false, ""},
		{"sdk/go/dsec", "api/sparse", false, ""},
		{"cmd/dsec", "internal/server", false, ""},
	}
	for _, tt := range tests {
		got := checkImport(tt.from, tt.to, tt.test)
		if tt.want == "" && got != "" || !strings.Contains(got, tt.want) {
			t.Errorf("checkImport(%q, %q, test=%v) = %q, want %q", tt.from, tt.to, tt.test, got, tt.want)
		}
	}
	for _, l := range layers {
		for _, p := range l.pkgs {
			if p == "" || strings.HasPrefix(p, "/") || strings.HasSuffix(p, "/") {
				t.Errorf("layer %q: pattern %q, want a path relative to %s", l.name, p, Module)
			}
		}
	}
}

// allowedRequires lists, for a module directory, every module its go.mod
// may require.
var allowedRequires = map[string][]string{
	// The generated code needs its runtimes; go-cmp is for tests.
	"api": {"connectrpc.com/connect", "google.golang.org/protobuf", "github.com/google/go-cmp"},
}

// TestModulesAlone checks the API and SDK modules as a user gets them: on
// their own (GOWORK=off, in their directories, with their own go.mod), their
// module graphs hold neither etcd nor gRPC nor the server's module, and they
// build, vet and pass their tests (with -race when this test has it). This
// is how `go test ./...` in the server's module runs the SDK's tests.
func TestModulesAlone(t *testing.T) {
	root := repoRoot(t)
	forbiddenModules := []string{"go.etcd.io/", "google.golang.org/grpc", Module + " "}
	for _, m := range modules[1:] {
		t.Run(m.dir, func(t *testing.T) {
			dir := filepath.Join(root, m.dir)
			graph := strings.Split(strings.TrimSpace(string(run(t, goCmd(t, dir, "list", "-m", "all")))), "\n")
			if len(graph) == 0 || !strings.HasPrefix(graph[0], m.path) {
				t.Fatalf("go list -m all in %s starts with %q, want module %s", m.dir, graph[0], m.path)
			}
			t.Logf("go list -m all in %s: %d modules", m.dir, len(graph))
			if want, ok := allowedRequires[m.dir]; ok {
				var gomod struct{ Require []struct{ Path string } }
				if err := json.Unmarshal(run(t, goCmd(t, dir, "mod", "edit", "-json")), &gomod); err != nil {
					t.Fatalf("go mod edit -json in %s: %v", m.dir, err)
				}
				for _, r := range gomod.Require {
					if !slices.Contains(want, r.Path) {
						t.Errorf("%s/go.mod requires %s; it may require only %s", m.dir, r.Path, strings.Join(want, ", "))
					}
				}
			}
			for _, mod := range graph {
				for _, bad := range forbiddenModules {
					if strings.HasPrefix(mod+" ", bad) {
						t.Errorf("module %s needs %s; it must not pull in the server's dependencies", m.path, mod)
					}
				}
			}
			if m.dir == "api" {
				checkGenerator(t, root, dir)
			}
			run(t, goCmd(t, dir, "vet", "./..."))
			if testing.Short() {
				t.Skip("-short: not running the module's tests")
			}
			args := []string{"test"}
			if raceEnabled {
				args = append(args, "-race")
			}
			run(t, goCmd(t, dir, append(args, "./...")...))
		})
	}
}

// checkGenerator checks that the API module requires the runtimes at the
// versions of the code generators (the server's go.mod pins protoc-gen-go
// and protoc-gen-connect-go with tool directives): code generated by a newer
// plugin than the runtime a user gets may not build.
func checkGenerator(t *testing.T, root, apiDir string) {
	t.Helper()
	var gomod struct {
		Require []struct{ Path, Version string }
	}
	if err := json.Unmarshal(run(t, goCmd(t, apiDir, "mod", "edit", "-json")), &gomod); err != nil {
		t.Fatalf("go mod edit -json in %s: %v", apiDir, err)
	}
	for _, runtime := range []string{"google.golang.org/protobuf", "connectrpc.com/connect"} {
		gen := strings.TrimSpace(string(run(t, goCmd(t, root, "list", "-m", "-f", "{{.Version}}", runtime))))
		i := slices.IndexFunc(gomod.Require, func(r struct{ Path, Version string }) bool { return r.Path == runtime })
		if i < 0 {
			t.Errorf("api/go.mod does not require %s", runtime)
			continue
		}
		if got := gomod.Require[i].Version; got != gen {
			t.Errorf("api/go.mod requires %s %s, but the code is generated with %s: run `cd api && go get %s@%s && go mod tidy`", runtime, got, gen, runtime, gen)
		}
	}
}
