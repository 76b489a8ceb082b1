package ociimport

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"io"
	"io/fs"
	"log"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/erofs/go-erofs"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/compression"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/static"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// memStore is a Store in memory. It checks that every upload has the
// digest and size it claims.
type memStore struct {
	mu      sync.Mutex
	layers  map[string][]byte // guarded by mu
	images  map[string]imageRec
	uploads int
}

type imageRec struct {
	Layers []string
	Config Config
}

func newMemStore() *memStore {
	return &memStore{layers: map[string][]byte{}, images: map[string]imageRec{}}
}

func (s *memStore) HasLayer(_ context.Context, digest string) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	_, ok := s.layers[digest]
	return ok, nil
}

func (s *memStore) UploadLayer(_ context.Context, r io.Reader, digest string, size int64) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	sum := sha256.Sum256(b)
	if got := "sha256:" + hex.EncodeToString(sum[:]); got != digest || int64(len(b)) != size {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "upload: got %s (%d bytes), header said %s (%d)", got, len(b), digest, size)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.layers[digest] = b
	s.uploads++
	return nil
}

func (s *memStore) CreateImage(_ context.Context, name string, layers []string, cfg Config) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, l := range layers {
		if _, ok := s.layers[l]; !ok {
			return errdefs.Newf(errdefs.ErrFailedPrecondition, "layer %s is not stored", l)
		}
	}
	s.images[name] = imageRec{Layers: layers, Config: cfg}
	return nil
}

type entry struct {
	tar.Header
	data string
}

func file(name, data string) entry {
	return entry{tar.Header{Typeflag: tar.TypeReg, Name: name, Mode: 0o644, Size: int64(len(data))}, data}
}

func mkdir(name string) entry {
	return entry{tar.Header{Typeflag: tar.TypeDir, Name: name, Mode: 0o755}, ""}
}

func makeTar(t *testing.T, entries ...entry) []byte {
	t.Helper()
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := e.Header
		h.ModTime = time.Unix(1_700_000_000, 0)
		if err := tw.WriteHeader(&h); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, e.data); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return buf.Bytes()
}

// tarLayer is a layer of the tar b, compressed as comp says.
func tarLayer(t *testing.T, b []byte, comp compression.Compression) v1.Layer {
	t.Helper()
	opts := []tarball.LayerOption{tarball.WithCompression(comp)}
	if comp == compression.ZStd {
		opts = append(opts, tarball.WithMediaType(types.OCILayerZStd))
	}
	l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) { return io.NopCloser(bytes.NewReader(b)), nil }, opts...)
	if err != nil {
		t.Fatal(err)
	}
	return l
}

var testConfig = v1.Config{
	Env:        []string{"PATH=/opt/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
	WorkingDir: "/task",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

var wantConfig = Config{
	Env:        []string{"PATH=/opt/bin:/usr/bin:/bin", "LANG=C.UTF-8"},
	Workdir:    "/task",
	User:       "1000:1000",
	Entrypoint: []string{"/bin/sh", "-c"},
	Cmd:        []string{"echo hi"},
}

// testImage is a two-layer image: a base, and a layer that removes and
// adds files with OCI whiteouts.
func testImage(t *testing.T, arch string, extra ...v1.Layer) v1.Image {
	t.Helper()
	base := tarLayer(t, makeTar(t, mkdir("etc/"), file("etc/passwd", "root"), file("etc/arch", arch), mkdir("d/"), file("d/old", "o")), compression.GZip)
	top := tarLayer(t, makeTar(t, file("etc/.wh.passwd", ""), mkdir("d/"), file("d/.wh..wh..opq", ""), file("d/new", "n")), compression.ZStd)
	img, err := mutate.AppendLayers(empty.Image, append([]v1.Layer{base, top}, extra...)...)
	if err != nil {
		t.Fatal(err)
	}
	cf, err := img.ConfigFile()
	if err != nil {
		t.Fatal(err)
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture, cf.Config = "linux", arch, testConfig
	img, err = mutate.ConfigFile(img, cf)
	if err != nil {
		t.Fatal(err)
	}
	return mutate.MediaType(img, types.OCIManifestSchema1)
}

func importIt(t *testing.T, src string, store *memStore, opts Options) (*Result, error) {
	t.Helper()
	s, err := ParseSource(src)
	if err != nil {
		t.Fatalf("ParseSource(%q) = %v", src, err)
	}
	if opts.TempDir == "" {
		opts.TempDir = t.TempDir()
	}
	return Import(context.Background(), s, "imported:1", store, opts)
}

// checkImported checks the image registered as imported:1 against
// testImage(arch).
func checkImported(t *testing.T, store *memStore, arch string) {
	t.Helper()
	im, ok := store.images["imported:1"]
	if !ok {
		t.Fatalf("no image registered; have %v", store.images)
	}
	if diff := cmp.Diff(wantConfig, im.Config); diff != "" {
		t.Errorf("image config (-want +got):\n%s", diff)
	}
	if len(im.Layers) != 2 {
		t.Fatalf("image has %d layers, want 2", len(im.Layers))
	}
	base := readLayer(t, store.layers[im.Layers[0]])
	if got := readFile(t, base, "etc/arch"); got != arch {
		t.Errorf("etc/arch = %q, want %q (the %s image)", got, arch, arch)
	}
	top := readLayer(t, store.layers[im.Layers[1]])
	fi, err := fs.Stat(top, "etc/passwd")
	if err != nil || fi.Mode()&fs.ModeCharDevice == 0 {
		t.Errorf("top layer etc/passwd = %v, %v; want a whiteout (character device)", fi, err)
	}
	fi, err = fs.Stat(top, "d")
	if err != nil || fi.Sys().(*erofs.Stat).Xattrs["trusted.overlay.opaque"] != "y" {
		t.Errorf("top layer d = %v, %v; want an opaque directory", fi, err)
	}
	if got := readFile(t, top, "d/new"); got != "n" {
		t.Errorf("d/new = %q, want \"n\"", got)
	}
}

func readLayer(t *testing.T, b []byte) fs.FS {
	t.Helper()
	fsys, err := erofs.Open(bytes.NewReader(b))
	if err != nil {
		t.Fatalf("open stored layer: %v", err)
	}
	return fsys
}

func readFile(t *testing.T, fsys fs.FS, p string) string {
	t.Helper()
	b, err := fs.ReadFile(fsys, p)
	if err != nil {
		t.Errorf("read %s: %v", p, err)
	}
	return string(b)
}

// newRegistry serves an in-process registry, wrapped by wrap if not nil.
func newRegistry(t *testing.T, wrap func(http.Handler) http.Handler) string {
	t.Helper()
	var h http.Handler = registry.New(registry.Logger(log.New(io.Discard, "", 0)))
	if wrap != nil {
		h = wrap(h)
	}
	srv := httptest.NewServer(h)
	t.Cleanup(srv.Close)
	return strings.TrimPrefix(srv.URL, "http://")
}

func push(t *testing.T, ref string, img v1.Image, opts ...remote.Option) {
	t.Helper()
	r, err := name.ParseReference(ref)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(r, img, opts...); err != nil {
		t.Fatalf("push %s: %v", ref, err)
	}
}

func TestImportRegistryIndex(t *testing.T) {
	host := newRegistry(t, nil)
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: testImage(t, "arm64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: testImage(t, "amd64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	ref, err := name.ParseReference(host + "/team/multi:v1")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.WriteIndex(ref, idx); err != nil {
		t.Fatal(err)
	}

	store := newMemStore()
	var events []Phase
	res, err := importIt(t, "docker://"+host+"/team/multi:v1", store, Options{Progress: func(e Event) { events = append(events, e.Phase) }})
	if err != nil {
		t.Fatalf("Import = %v", err)
	}
	checkImported(t, store, "amd64")
	if res.Platform != "linux/amd64" || store.uploads != 2 {
		t.Errorf("Import() platform %q with %d uploads, want linux/amd64 with 2", res.Platform, store.uploads)
	}
	for _, p := range []Phase{PhaseConvert, PhaseConverted, PhaseStored} {
		if !slicesContains(events, p) {
			t.Errorf("progress events %v lack phase %d", events, p)
		}
	}

	// Again, for another platform and without the prefix: the new base is
	// uploaded, the shared top layer is not.
	res, err = importIt(t, host+"/team/multi:v1", store, Options{Platform: "linux/arm64"})
	if err != nil {
		t.Fatalf("Import(arm64) = %v", err)
	}
	checkImported(t, store, "arm64")
	if up := []bool{res.Layers[0].Uploaded, res.Layers[1].Uploaded}; !cmp.Equal(up, []bool{true, false}) || store.uploads != 3 {
		t.Errorf("second import uploaded %v (%d uploads in all), want [true false] (3)", up, store.uploads)
	}

	_, err = importIt(t, host+"/team/multi:v1", store, Options{Platform: "linux/s390x"})
	if !errdefs.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "linux/arm64") {
		t.Errorf("Import(s390x) = %v, want NotFound listing the platforms", err)
	}
	_, err = importIt(t, host+"/team/missing:v1", store, Options{})
	if !errdefs.Is(err, errdefs.ErrNotFound) {
		t.Errorf("Import(missing repository) = %v, want NotFound", err)
	}
}

func slicesContains[T comparable](s []T, v T) bool {
	for _, x := range s {
		if x == v {
			return true
		}
	}
	return false
}

func TestImportRegistryAuth(t *testing.T) {
	host := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if u, p, ok := r.BasicAuth(); !ok || u != "ci" || p != "s3cret" {
				w.Header().Set("WWW-Authenticate", `Basic realm="test"`)
				http.Error(w, `{"errors":[{"code":"UNAUTHORIZED","message":"log in"}]}`, http.StatusUnauthorized)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, host+"/private/img:1", testImage(t, "amd64"), remote.WithAuth(&authn.Basic{Username: "ci", Password: "s3cret"}))

	store := newMemStore()
	_, err := importIt(t, host+"/private/img:1", store, Options{Keychain: authn.NewMultiKeychain()})
	if !errdefs.Is(err, errdefs.ErrUnauthenticated) {
		t.Errorf("Import(no credentials) = %v, want Unauthenticated", err)
	}
	if _, err := importIt(t, host+"/private/img:1", store, Options{Auth: &authn.Basic{Username: "ci", Password: "s3cret"}}); err != nil {
		t.Fatalf("Import(with credentials) = %v", err)
	}
	checkImported(t, store, "amd64")
}

func TestImportLayout(t *testing.T) {
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(testImage(t, "arm64"), layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "other"})); err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(testImage(t, "amd64"), layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "v1"})); err != nil {
		t.Fatal(err)
	}
	// A multi-platform index, as docker buildx writes one.
	idx := mutate.AppendManifests(empty.Index,
		mutate.IndexAddendum{Add: testImage(t, "arm64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "arm64"}}},
		mutate.IndexAddendum{Add: testImage(t, "amd64"), Descriptor: v1.Descriptor{Platform: &v1.Platform{OS: "linux", Architecture: "amd64"}}},
	)
	if err := p.AppendIndex(idx, layout.WithAnnotations(map[string]string{"org.opencontainers.image.ref.name": "multi"})); err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	if _, err := importIt(t, "oci-layout:"+dir+":v1", store, Options{}); err != nil {
		t.Fatalf("Import(layout) = %v", err)
	}
	checkImported(t, store, "amd64")
	for _, arch := range []string{"arm64", "amd64"} {
		store := newMemStore()
		if _, err := importIt(t, "oci-layout:"+dir+":multi", store, Options{Platform: "linux/" + arch}); err != nil {
			t.Fatalf("Import(layout index, %s) = %v", arch, err)
		}
		checkImported(t, store, arch)
	}
	_, err = importIt(t, "oci-layout:"+dir, store, Options{})
	if !errdefs.Is(err, errdefs.ErrInvalidArgument) && !errdefs.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "multi") {
		t.Errorf("Import(layout of several images, no ref) = %v, want an error listing the refs", err)
	}
	_, err = importIt(t, "oci-layout:"+dir+":nope", store, Options{})
	if !errdefs.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "other") {
		t.Errorf("Import(unknown ref) = %v, want NotFound listing the refs", err)
	}
}

func TestImportDockerArchive(t *testing.T) {
	f := filepath.Join(t.TempDir(), "img.tar")
	tag, err := name.NewTag("example.com/app:latest")
	if err != nil {
		t.Fatal(err)
	}
	if err := tarball.WriteToFile(f, tag, testImage(t, "amd64")); err != nil {
		t.Fatal(err)
	}
	store := newMemStore()
	if _, err := importIt(t, "docker-archive:"+f, store, Options{}); err != nil {
		t.Fatalf("Import(docker archive) = %v", err)
	}
	checkImported(t, store, "amd64")
}

// layoutWith writes img to a new layout and returns its directory.
func layoutWith(t *testing.T, img v1.Image) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	return dir
}

// blobPath is the file of img's layer i in the layout dir.
func blobPath(t *testing.T, dir string, img v1.Image, i int) string {
	t.Helper()
	ls, err := img.Layers()
	if err != nil {
		t.Fatal(err)
	}
	d, err := ls[i].Digest()
	if err != nil {
		t.Fatal(err)
	}
	return filepath.Join(dir, "blobs", d.Algorithm, d.Hex)
}

func TestImportRefuses(t *testing.T) {
	tamper := func(f func(t *testing.T, blob string)) func(t *testing.T) string {
		return func(t *testing.T) string {
			img := testImage(t, "amd64")
			dir := layoutWith(t, img)
			blob := blobPath(t, dir, img, 1)
			if err := os.Chmod(blob, 0o644); err != nil {
				t.Fatal(err)
			}
			f(t, blob)
			return "oci-layout:" + dir
		}
	}
	withLayer := func(l v1.Layer) func(t *testing.T) string {
		return func(t *testing.T) string {
			return "oci-layout:" + layoutWith(t, testImage(t, "amd64", l))
		}
	}
	tests := []struct {
		name string
		src  func(t *testing.T) string
		kind error
		msg  string
	}{
		{"digest mismatch", tamper(func(t *testing.T, blob string) {
			// Another valid zstd tar of the same layer: decodes fine, hashes wrong.
			b, err := os.ReadFile(blob)
			if err != nil {
				t.Fatal(err)
			}
			other := tarLayer(t, makeTar(t, file("etc/.wh.passwd", ""), file("evil", "x")), compression.ZStd)
			rc, _ := other.Compressed()
			ob, _ := io.ReadAll(rc)
			_ = b
			if err := os.WriteFile(blob, ob, 0o644); err != nil {
				t.Fatal(err)
			}
		}), errdefs.ErrInvalidArgument, "tampered"},
		{"truncated blob", tamper(func(t *testing.T, blob string) {
			st, err := os.Stat(blob)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.Truncate(blob, st.Size()/2); err != nil {
				t.Fatal(err)
			}
		}), errdefs.ErrInvalidArgument, "truncated"},
		{"unknown media type", withLayer(static.NewLayer([]byte("not a tar"), "application/vnd.example.thing.v1")), errdefs.ErrInvalidArgument, "application/vnd.example.thing.v1"},
		{"foreign layer", withLayer(static.NewLayer([]byte("x"), types.DockerForeignLayer)), errdefs.ErrInvalidArgument, "foreign"},
		{"dotdot", withLayer(tarLayer(t, makeTar(t, file("../escape", "x")), compression.GZip)), errdefs.ErrInvalidArgument, `"../escape"`},
		{"absolute", withLayer(tarLayer(t, makeTar(t, file("/etc/shadow", "x")), compression.None)), errdefs.ErrInvalidArgument, `"/etc/shadow"`},
		{"link out", withLayer(tarLayer(t, makeTar(t, entry{tar.Header{Typeflag: tar.TypeLink, Name: "l", Linkname: "../../etc/shadow"}, ""}), compression.GZip)), errdefs.ErrInvalidArgument, `"l"`},
		{"not a tar", withLayer(static.NewLayer(bytes.Repeat([]byte("garbage!"), 200), types.OCIUncompressedLayer)), errdefs.ErrInvalidArgument, "malformed"},
		{"diff_id mismatch", func(t *testing.T) string {
			img := testImage(t, "amd64")
			cf, err := img.ConfigFile()
			if err != nil {
				t.Fatal(err)
			}
			cf = cf.DeepCopy()
			cf.RootFS.DiffIDs[1] = v1.Hash{Algorithm: "sha256", Hex: strings.Repeat("0", 64)}
			img, err = mutate.ConfigFile(img, cf)
			if err != nil {
				t.Fatal(err)
			}
			return "oci-layout:" + layoutWith(t, img)
		}, errdefs.ErrInvalidArgument, "diff_id"},
		{"missing layout", func(t *testing.T) string { return "oci-layout:" + filepath.Join(t.TempDir(), "nope") }, errdefs.ErrNotFound, "does not exist"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			store := newMemStore()
			tmp := t.TempDir()
			_, err := importIt(t, tt.src(t), store, Options{TempDir: tmp})
			if !errdefs.Is(err, tt.kind) || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("Import(%s) = %v, want %v mentioning %q", tt.name, err, tt.kind, tt.msg)
			}
			if len(store.images) != 0 || store.uploads != 0 {
				t.Errorf("Import(%s) registered %d images and uploaded %d layers, want none", tt.name, len(store.images), store.uploads)
			}
			if left, _ := os.ReadDir(tmp); len(left) != 0 {
				t.Errorf("Import(%s) left %d files in TempDir", tt.name, len(left))
			}
		})
	}
}

// A registry that serves a layer's blob with other bytes: the import
// fails and registers nothing.
func TestImportRegistryTampered(t *testing.T) {
	img := testImage(t, "amd64")
	ls, _ := img.Layers()
	bad, _ := ls[1].Digest()
	host := newRegistry(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.Method == http.MethodGet && strings.HasSuffix(r.URL.Path, "/blobs/"+bad.String()) {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, r)
				b := rec.Body.Bytes()
				if len(b) > 100 {
					b[len(b)-20] ^= 0xff
				}
				w.WriteHeader(rec.Code)
				_, _ = w.Write(b)
				return
			}
			h.ServeHTTP(w, r)
		})
	})
	push(t, host+"/t/img:1", img)
	store := newMemStore()
	_, err := importIt(t, host+"/t/img:1", store, Options{})
	if !errdefs.Is(err, errdefs.ErrInvalidArgument) || !strings.Contains(err.Error(), "tampered") {
		t.Errorf("Import(tampered blob) = %v, want InvalidArgument saying the blob was tampered with", err)
	}
	if len(store.images) != 0 || store.uploads != 0 {
		t.Errorf("Import(tampered blob) registered %d images and uploaded %d layers, want none", len(store.images), store.uploads)
	}
}

func TestParseSource(t *testing.T) {
	dir := t.TempDir()
	colon := filepath.Join(dir, "a:b")
	if err := os.Mkdir(colon, 0o755); err != nil {
		t.Fatal(err)
	}
	good := []struct {
		in   string
		want Source
	}{
		{"docker://example.com/a/b:1", Source{Kind: Registry, Ref: "example.com/a/b:1"}},
		{"example.com:5000/a@sha256:" + strings.Repeat("a", 64), Source{Kind: Registry, Ref: "example.com:5000/a@sha256:" + strings.Repeat("a", 64)}},
		{"oci-layout:" + dir, Source{Kind: Layout, Path: dir}},
		{"oci-layout:" + dir + ":v1", Source{Kind: Layout, Path: dir, Ref: "v1"}},
		{"oci-layout:" + colon, Source{Kind: Layout, Path: colon}},
		{"docker-archive:x.tar", Source{Kind: DockerArchive, Path: "x.tar"}},
	}
	for _, tt := range good {
		got, err := ParseSource(tt.in)
		if err != nil || got != tt.want {
			t.Errorf("ParseSource(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
	for _, in := range []string{"docker://", "docker://Upper/Case", "docker://a/b:bad tag", "oci-layout:", "docker-archive:", "oci:dir", "a/b@sha256:short", ""} {
		if _, err := ParseSource(in); !errdefs.Is(err, errdefs.ErrInvalidArgument) {
			t.Errorf("ParseSource(%q) = %v, want InvalidArgument", in, err)
		}
	}
}
