//go:build linux

package main

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestFileSizes(t *testing.T) {
	for _, s := range []treeSpec{
		{seed: 1, files: 2000, bytes: 60 << 20},
		{seed: 7, files: 300, bytes: 4 << 20},
		{seed: 3, files: 10, bytes: 5}, // fewer bytes than files: one byte each
	} {
		sizes := fileSizes(s)
		var sum int64
		for _, n := range sizes {
			if n < 1 {
				t.Fatalf("fileSizes(%+v) has a size %d < 1", s, n)
			}
			sum += n
		}
		want := max(s.bytes, int64(s.files))
		if len(sizes) != s.files || sum != want {
			t.Errorf("fileSizes(%+v) = %d files of %d bytes, want %d of %d", s, len(sizes), sum, s.files, want)
		}
		if !cmp.Equal(sizes, fileSizes(s)) {
			t.Errorf("fileSizes(%+v) differs between calls", s)
		}
	}
}

func TestGenTreeDeterministic(t *testing.T) {
	dir := t.TempDir()
	spec := treeSpec{seed: 5, files: 70, bytes: 100 << 10, marker: "ws-5\n", markerName: "ID"}
	var trees [3]map[string][]byte
	for i, s := range []treeSpec{spec, spec, {seed: 6, files: 70, bytes: 100 << 10, marker: "ws-6\n", markerName: "ID"}} {
		root := filepath.Join(dir, string(rune('a'+i)))
		st, err := genTree(root, s)
		if err != nil {
			t.Fatal(err)
		}
		if want := (treeStats{Files: 71, Dirs: 4, Bytes: 100<<10 + 5}); st != want {
			t.Errorf("genTree(%+v) = %+v, want %+v", s, st, want)
		}
		trees[i] = readTree(t, root)
	}
	if !cmp.Equal(trees[0], trees[1]) {
		t.Errorf("two trees of one spec differ")
	}
	if string(trees[0]["ID"]) != "ws-5\n" || bytes.Equal(trees[0][filePath(0)], trees[2][filePath(0)]) {
		t.Errorf("marker %q, first files equal across seeds: %v; want ws-5 and different content",
			trees[0]["ID"], bytes.Equal(trees[0][filePath(0)], trees[2][filePath(0)]))
	}
}

func readTree(t *testing.T, root string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	err := filepath.WalkDir(root, func(p string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(root, p)
		out[filepath.ToSlash(rel)], err = os.ReadFile(p)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestReport(t *testing.T) {
	ds := func(msv ...int) []time.Duration {
		var out []time.Duration
		for _, v := range msv {
			out = append(out, time.Duration(v)*time.Millisecond)
		}
		return out
	}
	layers := &Mode{Name: modeLayers, Rounds: []*Round{
		{WallMs: 1000, WritableBytes: 10, ready: ds(100, 200), create: ds(90, 190), fill: ds(0, 0)},
		{WallMs: 3000, WritableBytes: 30, ready: ds(300), create: ds(290), fill: ds(0)},
		{WallMs: 2000, WritableBytes: 20, ready: ds(400), create: ds(390), fill: ds(0)},
	}}
	tarx := &Mode{Name: modeTar, Rounds: []*Round{
		{WallMs: 3600, ready: ds(500, 600, 700, 800)},
		{WallMs: 99999, ready: ds(900), Error: "boom"}, // its wall time is not of N
	}}
	rep := &Report{Config: Config{N: 4, Concurrency: 2, Rounds: 3}, Modes: []*Mode{layers, tarx}}
	for _, m := range rep.Modes {
		m.summarize()
	}
	rep.ratios()
	if layers.WallMs != 2000 || layers.WritableBytes != 20 || layers.Ready.N != 4 || layers.Ready.P50 != 200 {
		t.Errorf("layers summary: wall %v, writable %d, ready n %d p50 %v; want 2000, 20, 4, 200",
			layers.WallMs, layers.WritableBytes, layers.Ready.N, layers.Ready.P50)
	}
	if tarx.WallMs != 3600 || tarx.Ready.N != 5 || tarx.Ready.P99 != 900 {
		t.Errorf("tar summary: wall %v, ready n %d p99 %v; want 3600, 5, 900", tarx.WallMs, tarx.Ready.N, tarx.Ready.P99)
	}
	if rep.Ratio != 1.8 || rep.RatioP50 != 3.5 {
		t.Errorf("ratios = %v, %v; want 1.8, 3.5", rep.Ratio, rep.RatioP50)
	}
	var b strings.Builder
	writeTable(&b, rep)
	if !strings.Contains(b.String(), "1.80× for all 4 (wall), 3.50× per sandbox (p50)") {
		t.Errorf("table lacks the ratios:\n%s", b.String())
	}

	rep.Modes = rep.Modes[:1]
	rep.ratios()
	if rep.Ratio != 0 || rep.RatioP50 != 0 {
		t.Errorf("ratios with one mode = %v, %v; want 0, 0", rep.Ratio, rep.RatioP50)
	}
}
