package apierr

import (
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// flattened lists the user-facing messages (errdefs.Newf of a kind other
// than Internal) that format an error's text, by package and format, with
// why that text is fit for whoever reads it. Such text is flattened:
// apierr cannot see the host paths of the error's types in it, so each one
// is reviewed here.
var flattened = map[msgKey]string{
	{"internal/apiserver", "node %s did not say which layers its sandboxes use (%v): bring it back, or wait until it leaves the cluster, and retry"}: "an edge's reply (public, apierr.FromConnect) or edgeErr's own message",
	{"internal/cluster", "invalid image reference %.80q: %v"}:                                                                             "the reference parser on the caller's own reference",
	{"internal/cluster", "invalid image reference %q: %v"}:                                                                                "the reference parser on the caller's own reference",
	{"internal/layer", "squash: layer %d is not a valid EROFS image: %v"}:                                                                 "the EROFS reader on the layer's bytes",
	{"internal/layer", "%s: malformed tar stream: %v"}:                                                                                    "archive/tar on the caller's stream",
	{"internal/layer", "tar stream: bad gzip header: %v"}:                                                                                 "compress/gzip on the caller's stream",
	{"internal/sandboxfs", "the archive is not a valid tar stream after %d entries (%v)"}:                                                 "archive/tar on the caller's stream",
	{"internal/layer", "%s: %v"}:                                                                                                          "layer: checkXattrs' own words on a file's attributes; the file as users know it (scanner.shown)",
	{"internal/keeper", "keeper request: %v"}:                                                                                             "encoding/json on the edge's own request to its keeper",
	{"internal/keeper", "keeper settings: %v"}:                                                                                            "the keeper's check of the settings the edge pushes, from its own flags",
	{"internal/keeper", "sealed exec: make /.dsec in the sandbox: %v (free space in its writable layer)"}:                                 "an errno of mkdirat at the sandbox's root descriptor: no path",
	{"internal/swap", "swap record %s is damaged (%v): turn off the swap file it names by hand (swapoff), then remove the record"}:        "encoding/json on dsec up's own record in its state dir; only dsec up, down and purge read it, on the operator's host",
	{"internal/sandbox/sandboxtest", "bad archive: %v"}:                                                                                   "the fake backend's archive/tar on a test's own stream",
	{"internal/cgroup", "the sandboxes use more memory than the ceiling of %d bytes (%v): delete sandboxes or reserve less for the host"}: "start-up: the operator's host ceiling",
	{"internal/cgroup", "read mountinfo: %v"}:                                                                                             "start-up: the host's cgroup layout, for the operator",
	{"internal/cgroup", "mountinfo line %d: %v"}:                                                                                          "start-up: the host's cgroup layout, for the operator",
	{"internal/diskquota", "open /dev/loop-control: %v: load the loop module (modprobe loop) and give the process /dev"}:                  "start-up: the node's disk quota file system, for the operator",
	{"internal/edge/backend/container", "the node keeper (pid %d, keeper protocol %d) does not say its settings and its command line cannot be read (%v): stop it, or run dsec as root"}: "start-up: the edge meets a running keeper, for the operator",
	{"internal/edge/backend/container", "the settings of the node keeper (pid %d, keeper protocol %d) cannot be read from its command line (%v): stop it"}:                               "start-up: the edge meets a running keeper, for the operator",
	{"internal/keeper", "keeper exited at start (%v); see %s"}:       "start-up: the keeper's launch, for the operator",
	{"internal/server", "--sandboxfusion-key-file: %v"}:              "start-up: the operator's own flag",
	{"internal/server", "listen on %s (--sandboxfusion-listen): %v"}: "start-up: the operator's own flag",
	{"internal/server", "listen on %s (--listen): %v"}:               "start-up: the operator's own flag",
	{"internal/server", "listen on %s (--ports-listen): %v"}:         "start-up: the operator's own flag",
}

// msgKey names a message: its package's directory and its format.
type msgKey struct{ pkg, format string }

// toFix lists user-facing messages that show flattened text they should
// not (a host path or PID), in packages whose owners fix them; the test
// names them in its log.
var toFix = map[msgKey]string{
	{"internal/keeper", "node keeper at %s does not answer (%v): restart `dsec up`"}:  "names the keeper's socket and the dial error (host paths): apierr.WithDetail(…, err)",
	{"internal/keeper", "open the sandbox's root for a terminal: %v"}:                 "the open error names /proc/PID/root (a host PID)",
	{"internal/keeper", "the sandbox has no usable /dev/pts/ptmx for a terminal: %v"}: "the open error names /proc/PID/root/dev/pts/ptmx (a host PID)",
	{"internal/keeper", "the sandbox's init is gone: %v"}:                             "the error names /proc/PID/ns/… (a host PID)",
}

// cliOnly lists packages only the CLI runs: their messages go to the
// terminal of the user whose files and flags they are about. The test
// checks that no other package imports them.
var cliOnly = map[string]bool{
	"internal/ociimport": true, // dsec image import
	"internal/debian":    true, // dsec image build --debian
}

// TestNoFlattenedErrors reads the module's Go files (cheaply: syntax only)
// for user-facing messages that format an error value (an argument named
// err, …err or …Err, or a call of that name) and fails for those not
// reviewed in flattened. The text of an OS error, a runtime or a
// dependency often names host paths, sockets or addresses; keep it out of
// messages users see (log it, or attach it with WithDetail), or wrap it
// with %w under the kind so that apierr cuts the host paths it declares.
func TestNoFlattenedErrors(t *testing.T) {
	root := filepath.Join("..", "..")
	fset := token.NewFileSet()
	seen := map[msgKey]bool{}
	var unreviewed []string
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			rel, _ := filepath.Rel(root, p)
			switch {
			case rel == ".":
				return nil
			case strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata" || d.Name() == "vendor":
				return filepath.SkipDir
			}
			if _, err := os.Stat(filepath.Join(p, "go.mod")); err == nil {
				return filepath.SkipDir // another module (the SDK, the API)
			}
			return nil
		}
		if !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(root, filepath.Dir(p))
		rel = filepath.ToSlash(rel)
		for _, im := range f.Imports {
			path, _ := strconv.Unquote(im.Path.Value)
			pkg, ok := strings.CutPrefix(path, module+"/")
			if ok && cliOnly[pkg] && !strings.HasPrefix(rel, "cmd/") && rel != pkg {
				t.Errorf("%s imports %s, which cliOnly says only the CLI runs: review its messages for users of the API", p, pkg)
			}
		}
		if cliOnly[rel] {
			return nil
		}
		ast.Inspect(f, func(n ast.Node) bool {
			c, ok := n.(*ast.CallExpr)
			if !ok || !isSel(c.Fun, "errdefs", "Newf") || len(c.Args) < 3 {
				return true
			}
			kind, ok := c.Args[0].(*ast.SelectorExpr)
			if !ok || kind.Sel.Name == "ErrInternal" {
				return true // Internal, or a kind decoded from a wire
			}
			lit, ok := c.Args[1].(*ast.BasicLit)
			if !ok {
				return true
			}
			format, _ := strconv.Unquote(lit.Value)
			for _, a := range c.Args[2:] {
				if errorValue(a) {
					key := msgKey{rel, format}
					seen[key] = true
					if why, ok := toFix[key]; ok {
						t.Logf("%s: %q: to fix: %s", fset.Position(c.Pos()), format, why)
					} else if _, ok := flattened[key]; !ok {
						unreviewed = append(unreviewed, fset.Position(c.Pos()).String()+": "+strconv.Quote(format))
					}
					break
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(unreviewed)
	for _, u := range unreviewed {
		t.Errorf("%s formats an error's text into a message users see: keep it out (log it, or apierr.WithDetail), wrap it with %%w, or say in flattened why it is fit for users", u)
	}
	for key := range flattened {
		if !seen[key] {
			t.Logf("flattened lists %q in %s, which no file there has any more", key.format, key.pkg)
		}
	}
}

// module is the module's path, which internal imports start with.
const module = "github.com/dsecproject/dsec"

func isSel(e ast.Expr, pkg, name string) bool {
	s, ok := e.(*ast.SelectorExpr)
	if !ok || s.Sel.Name != name {
		return false
	}
	x, ok := s.X.(*ast.Ident)
	return ok && x.Name == pkg
}

// errorValue reports whether e looks like an error value by the names Go
// code gives them: err, werr, z.err, s.Err(), edgeErr(…).
func errorValue(e ast.Expr) bool {
	named := func(s string) bool { return s == "err" || strings.HasSuffix(s, "err") || strings.HasSuffix(s, "Err") }
	switch v := e.(type) {
	case *ast.Ident:
		return named(v.Name)
	case *ast.SelectorExpr:
		return named(v.Sel.Name)
	case *ast.CallExpr:
		switch f := v.Fun.(type) {
		case *ast.Ident:
			return named(f.Name)
		case *ast.SelectorExpr:
			return named(f.Sel.Name)
		}
	}
	return false
}
