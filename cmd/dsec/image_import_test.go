//go:build !dsec_client

package main

import (
	"bytes"
	"strings"
	"testing"

	"github.com/dsecproject/dsec/internal/ociimport"
)

// Off a terminal, import progress is one line per converted layer and one
// per stored layer: no bars, no carriage returns.
func TestImportProgressNotATTY(t *testing.T) {
	var buf bytes.Buffer
	p := newImportProgress(&buf)
	l := ociimport.LayerResult{Source: "sha256:" + strings.Repeat("a", 64), Digest: "sha256:" + strings.Repeat("b", 64), MediaType: "application/vnd.oci.image.layer.v1.tar+gzip", Files: 3, Size: 8192, Skipped: 1}
	for i := range 2 {
		for done := int64(0); done <= 100<<20; done += 1 << 20 {
			p.event(ociimport.Event{Phase: ociimport.PhaseConvert, Index: i, Count: 2, Done: done, Total: 100 << 20})
		}
		p.event(ociimport.Event{Phase: ociimport.PhaseConverted, Index: i, Count: 2, Layer: l})
	}
	for i := range 2 {
		p.event(ociimport.Event{Phase: ociimport.PhaseUpload, Index: i, Count: 2, Done: 10, Total: 20})
		l.Uploaded = i == 0
		p.event(ociimport.Event{Phase: ociimport.PhaseStored, Index: i, Count: 2, Layer: l})
	}
	p.finish()
	out := buf.String()
	lines := strings.Split(strings.TrimSuffix(out, "\n"), "\n")
	want := []string{
		"layer 1/2 sha256:aaaaaaaaaaaa: 3 files, application/vnd.oci.image.layer.v1.tar+gzip → sha256:bbbbbbbbbbbb 8K (1 device nodes, sockets or aufs entries skipped)",
		"layer 2/2 sha256:aaaaaaaaaaaa: 3 files, application/vnd.oci.image.layer.v1.tar+gzip → sha256:bbbbbbbbbbbb 8K (1 device nodes, sockets or aufs entries skipped)",
		"layer 1/2 sha256:bbbbbbbbbbbb uploaded",
		"layer 2/2 sha256:bbbbbbbbbbbb already stored",
	}
	if strings.ContainsAny(out, "\r\033") || len(lines) != len(want) {
		t.Fatalf("progress off a terminal = %q, want %d plain lines", out, len(want))
	}
	for i := range want {
		if lines[i] != want[i] {
			t.Errorf("progress line %d = %q, want %q", i+1, lines[i], want[i])
		}
	}
}
