package e2e

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"net"
	"net/http"
	"strings"
	"testing"
)

// wheel builds a real, installable pure-Python wheel of package name at
// version: a module whose VALUE is value, with the dist-info pip checks
// (METADATA, WHEEL, and a RECORD of every file's digest and size).
func wheel(t *testing.T, name, version, value string) (file string, data []byte) {
	t.Helper()
	info := name + "-" + version + ".dist-info"
	files := []struct{ path, body string }{
		{name + "/__init__.py", fmt.Sprintf("VALUE = %q\n", value)},
		{info + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: a test package of dsec\n", name, version)},
		{info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: dsec-e2e\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var record strings.Builder
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	add := func(path, body string) {
		w, err := zw.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := w.Write([]byte(body)); err != nil {
			t.Fatal(err)
		}
	}
	for _, f := range files {
		add(f.path, f.body)
		sum := sha256.Sum256([]byte(f.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", f.path, base64.RawURLEncoding.EncodeToString(sum[:]), len(f.body))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	add(info+"/RECORD", record.String())
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s-%s-py3-none-any.whl", name, version), buf.Bytes()
}

// fakeIndex is a PEP 503 "simple" package index serving one wheel over
// plain HTTP: /simple/, /simple/NAME/ and /packages/FILE.
type fakeIndex struct {
	Addr  string      // host:port it listens on
	Hosts chan string // the Host header of each request, when not full
}

func startFakeIndex(t *testing.T, listen, name, file string, data []byte) *fakeIndex {
	t.Helper()
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeIndex{Addr: ln.Addr().String(), Hosts: make(chan string, 64)}
	sum := sha256.Sum256(data)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/simple/%s/\">%s</a></body></html>\n", name, name)
	})
	mux.HandleFunc("GET /simple/"+name+"/{$}", func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "<!DOCTYPE html><html><body><a href=\"/packages/%s#sha256=%s\">%s</a></body></html>\n", file, hex.EncodeToString(sum[:]), file)
	})
	mux.HandleFunc("GET /packages/"+file, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Write(data)
	})
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		select {
		case f.Hosts <- r.Host:
		default:
		}
		mux.ServeHTTP(w, r)
	})}
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return f
}
