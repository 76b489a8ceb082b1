package ociimport

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/remote/transport"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Kind is where a Source's image comes from.
type Kind int

const (
	// Registry: an image in an OCI (docker) registry.
	Registry Kind = iota
	// Layout: an OCI image layout directory.
	Layout
	// DockerArchive: a `docker save` tarball.
	DockerArchive
)

// Source names an image to import. Make one with ParseSource.
type Source struct {
	Kind Kind
	// Path is the layout directory or the archive file.
	Path string
	// Ref is the registry reference (HOST/REPO[:TAG|@DIGEST]), or for a
	// layout the optional ref name (org.opencontainers.image.ref.name) or
	// manifest digest.
	Ref string
}

func (s Source) String() string {
	switch s.Kind {
	case Layout:
		if s.Ref != "" {
			return "oci-layout:" + s.Path + ":" + s.Ref
		}
		return "oci-layout:" + s.Path
	case DockerArchive:
		return "docker-archive:" + s.Path
	}
	return "docker://" + s.Ref
}

// ParseSource parses oci-layout:DIR[:REF], docker-archive:FILE,
// docker://HOST/REPO[:TAG|@DIGEST] or a bare HOST/REPO[:TAG|@DIGEST].
// Errors are ErrInvalidArgument.
func ParseSource(s string) (Source, error) {
	bad := func(format string, args ...any) (Source, error) {
		return Source{}, errdefs.Newf(errdefs.ErrInvalidArgument, "image source %q: %s", s, fmt.Sprintf(format, args...))
	}
	switch {
	case strings.HasPrefix(s, "oci-layout:"):
		rest := strings.TrimPrefix(s, "oci-layout:")
		src := Source{Kind: Layout, Path: rest}
		// DIR:REF, unless DIR itself holds the colon.
		if i := strings.LastIndexByte(rest, ':'); i >= 0 && !strings.Contains(rest[i+1:], "/") {
			if _, err := os.Stat(rest); err != nil {
				src.Path, src.Ref = rest[:i], rest[i+1:]
			}
		}
		if src.Path == "" {
			return bad("want oci-layout:DIR[:REF]")
		}
		return src, nil
	case strings.HasPrefix(s, "docker-archive:"):
		p := strings.TrimPrefix(s, "docker-archive:")
		if p == "" {
			return bad("want docker-archive:FILE")
		}
		return Source{Kind: DockerArchive, Path: p}, nil
	case strings.HasPrefix(s, "oci:"), strings.HasPrefix(s, "docker-daemon:"), strings.HasPrefix(s, "containers-storage:"):
		return bad("unknown transport; use oci-layout:DIR[:REF], docker-archive:FILE or docker://HOST/REPO[:TAG]")
	}
	ref := strings.TrimPrefix(s, "docker://")
	if _, err := name.ParseReference(ref); err != nil {
		return bad("not an image reference (want HOST/REPO[:TAG|@sha256:DIGEST]): %v", err)
	}
	return Source{Kind: Registry, Ref: ref}, nil
}

// opened is an image ready to read.
type opened struct {
	img      v1.Image
	platform string
	close    func()
}

func (s Source) open(ctx context.Context, opts Options) (*opened, error) {
	want, err := platform(opts.Platform)
	if err != nil {
		return nil, err
	}
	switch s.Kind {
	case Layout:
		return s.openLayout(want)
	case DockerArchive:
		if _, err := os.Stat(s.Path); err != nil {
			return nil, osErr(s, err)
		}
		img, err := tarball.ImageFromPath(s.Path, nil)
		if err != nil {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: not a docker save archive of one image: %v", s, err)
		}
		return &opened{img: img, platform: "", close: func() {}}, nil
	}
	return s.openRemote(ctx, want, opts)
}

func platform(s string) (v1.Platform, error) {
	if s == "" {
		return v1.Platform{OS: "linux", Architecture: "amd64"}, nil
	}
	p, err := v1.ParsePlatform(s)
	if err != nil || p.OS == "" || p.Architecture == "" {
		return v1.Platform{}, errdefs.Newf(errdefs.ErrInvalidArgument, "platform %q: want OS/ARCH[/VARIANT], like linux/amd64", s)
	}
	return *p, nil
}

func (s Source) openRemote(ctx context.Context, want v1.Platform, opts Options) (*opened, error) {
	var nopts []name.Option
	if opts.Insecure {
		nopts = append(nopts, name.Insecure)
	}
	ref, err := name.ParseReference(s.Ref, nopts...)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: not an image reference: %v", s, err)
	}
	tr := opts.Transport
	if tr == nil {
		tr = http.DefaultTransport
	}
	if opts.Insecure {
		if t, ok := tr.(*http.Transport); ok {
			t = t.Clone()
			t.TLSClientConfig = &tls.Config{InsecureSkipVerify: true} //nolint:gosec // --insecure asks for it
			tr = t
		}
	}
	ropts := []remote.Option{remote.WithContext(ctx), remote.WithTransport(tr), remote.WithPlatform(want)}
	switch {
	case opts.Auth != nil:
		ropts = append(ropts, remote.WithAuth(opts.Auth))
	case opts.Keychain != nil:
		ropts = append(ropts, remote.WithAuthFromKeychain(opts.Keychain))
	default:
		ropts = append(ropts, remote.WithAuthFromKeychain(authn.DefaultKeychain))
	}
	desc, err := remote.Get(ref, ropts...)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", s, registryErr(err))
	}
	img, plat, err := pick(desc.MediaType, s, want, desc.ImageIndex, desc.Image)
	if err != nil {
		return nil, err
	}
	return &opened{img: img, platform: plat, close: func() {}}, nil
}

// registryErr gives a registry failure its kind.
func registryErr(err error) error {
	var te *transport.Error
	if !errors.As(err, &te) {
		if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		return errdefs.Newf(errdefs.ErrUnavailable, "reach the registry: %v", err)
	}
	switch te.StatusCode {
	case http.StatusNotFound:
		return errdefs.Newf(errdefs.ErrNotFound, "%v: check the repository and tag", err)
	case http.StatusUnauthorized:
		return errdefs.Newf(errdefs.ErrUnauthenticated, "%v: log in (docker login, or --username and --password-stdin)", err)
	case http.StatusForbidden:
		return errdefs.Newf(errdefs.ErrPermissionDenied, "%v: the credentials may not pull this repository", err)
	}
	return errdefs.Newf(errdefs.ErrUnavailable, "%v", err)
}

func (s Source) openLayout(want v1.Platform) (*opened, error) {
	if _, err := os.Stat(s.Path); err != nil {
		return nil, osErr(s, err)
	}
	p, err := layout.FromPath(s.Path)
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: not an OCI image layout (no oci-layout or index.json): %v", s, err)
	}
	idx, err := p.ImageIndex()
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: read index.json: %v", s, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: parse index.json: %v", s, err)
	}
	var found []v1.Descriptor
	var refs []string
	for _, d := range im.Manifests {
		rn := d.Annotations["org.opencontainers.image.ref.name"]
		if rn != "" {
			refs = append(refs, rn)
		}
		if s.Ref == "" || rn == s.Ref || d.Digest.String() == s.Ref {
			found = append(found, d)
		}
	}
	switch {
	case len(found) == 0 && s.Ref != "":
		return nil, errdefs.Newf(errdefs.ErrNotFound, "%s: no manifest named %q in index.json (names there: %s)", s, s.Ref, strings.Join(refs, ", "))
	case len(found) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: index.json lists no manifest", s)
	case len(found) > 1 && s.Ref == "":
		// Several images: maybe one per platform, as in a multi-platform
		// index written flat.
		img, plat, err := pick(types.OCIImageIndex, s, want, func() (v1.ImageIndex, error) { return idx, nil }, nil)
		if err != nil {
			return nil, fmt.Errorf("%w (or name one: oci-layout:DIR:REF, with REF among %s)", err, strings.Join(refs, ", "))
		}
		return &opened{img: img, platform: plat, close: func() {}}, nil
	}
	d := found[0]
	img, plat, err := pick(d.MediaType, s, want,
		func() (v1.ImageIndex, error) { return idx.ImageIndex(d.Digest) },
		func() (v1.Image, error) { return idx.Image(d.Digest) })
	if err != nil {
		return nil, err
	}
	return &opened{img: img, platform: plat, close: func() {}}, nil
}

// pick returns the image a manifest of media type mt names: itself, or
// from an index the one for platform want.
func pick(mt types.MediaType, s Source, want v1.Platform, index func() (v1.ImageIndex, error), image func() (v1.Image, error)) (v1.Image, string, error) {
	switch {
	case mt.IsImage():
		img, err := image()
		if err != nil {
			return nil, "", fmt.Errorf("%s: read image: %w", s, err)
		}
		return img, "", nil
	case mt.IsIndex():
	default:
		return nil, "", errdefs.Newf(errdefs.ErrInvalidArgument, "%s: manifest of media type %q is neither an image nor an index", s, mt)
	}
	idx, err := index()
	if err != nil {
		return nil, "", fmt.Errorf("%s: read index: %w", s, err)
	}
	im, err := idx.IndexManifest()
	if err != nil {
		return nil, "", errdefs.Newf(errdefs.ErrInvalidArgument, "%s: parse index: %v", s, err)
	}
	var have []string
	for _, d := range im.Manifests {
		if d.Platform == nil {
			continue
		}
		have = append(have, d.Platform.String())
		if !d.Platform.Satisfies(want) || !d.MediaType.IsImage() {
			continue
		}
		img, err := idx.Image(d.Digest)
		if err != nil {
			return nil, "", fmt.Errorf("%s: read image for %s: %w", s, d.Platform, err)
		}
		return img, d.Platform.String(), nil
	}
	return nil, "", errdefs.Newf(errdefs.ErrNotFound, "%s: no image for platform %s (the index has: %s); pick one with --platform", s, want.String(), strings.Join(have, ", "))
}

// osErr classifies a failure to find a local source.
func osErr(s Source, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return errdefs.Newf(errdefs.ErrNotFound, "%s: %s does not exist", s, s.Path)
	}
	return fmt.Errorf("%s: %w", s, err)
}
