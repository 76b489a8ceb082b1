//go:build !dsec_client

package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/ociimport"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newImageImportCmd(g *globalFlags) *cobra.Command {
	var (
		platform, username, tmpDir string
		passwordStdin, insecure    bool
		write                      imageWriteFlags
	)
	cmd := &cobra.Command{
		Use:   "import SOURCE NAME[:TAG]",
		Short: verbShort("import"),
		Long: `Import a container image as the dsec image NAME[:TAG]: each of its tar layers
becomes one EROFS layer (OCI whiteouts become overlayfs whiteouts and opaque
directories), and its config (Env with PATH, WorkingDir, User, Entrypoint, Cmd)
becomes the image's run config. SOURCE is one of:

  docker://HOST/REPO[:TAG|@sha256:DIGEST]   an image in a registry
  HOST/REPO[:TAG|@sha256:DIGEST]            the same, without the prefix
  oci-layout:DIR[:REF]                      an OCI image layout directory; REF is
                                            a ref name of its index.json or a digest
  docker-archive:FILE                       a docker save tarball of one image

From a multi-platform image the --platform one is taken. Every blob is checked
against the manifest's digest and every layer against the config's diff_id
before anything is stored: a corrupt, truncated or tampered layer, an unknown
layer media type or a tar entry leaving the root stops the import with nothing
registered. Layers the server already has are not uploaded again. Device nodes
in layers are left out (and counted).

Registry credentials come from ~/.docker/config.json (docker login, credential
helpers), or from --username with the password on standard input.`,
		Example: `  dsec image import docker://registry.example.com/team/py:3.11 py:3.11
  dsec image import --platform linux/arm64 docker.io/library/alpine:3.20 alpine
  dsec image import oci-layout:./out:v1 tools:1
  docker save -o app.tar app:latest && dsec image import docker-archive:app.tar app
  echo "$TOKEN" | dsec image import --username ci --password-stdin \
      --insecure docker://10.0.0.5:5000/base/py310:3 base/py310:3`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := write.check(); err != nil {
				return err
			}
			src, err := ociimport.ParseSource(args[0])
			if err != nil {
				return usageErrorf("%v", err)
			}
			ref, err := cluster.ParseRef(args[1])
			if err != nil {
				return usageErrorf("%v", err)
			}
			if passwordStdin && username == "" {
				return usageErrorf("--password-stdin needs --username")
			}
			opts := ociimport.Options{Platform: platform, Insecure: insecure, TempDir: tmpDir}
			if username != "" {
				if !passwordStdin {
					return usageErrorf("--username needs --password-stdin (the password is read from standard input)")
				}
				pw, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10))
				if err != nil {
					return fmt.Errorf("read password from standard input: %w", err)
				}
				opts.Auth = &authn.Basic{Username: username, Password: strings.TrimRight(string(pw), "\r\n")}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			errw := cmd.ErrOrStderr()
			p := newImportProgress(errw)
			opts.Progress = p.event
			start := time.Now()
			res, err := ociimport.Import(cmd.Context(), src, ref.String(), &apiStore{c: c, opts: write.options()}, opts)
			p.finish()
			if err != nil {
				return err
			}
			var size int64
			uploaded := 0
			for _, l := range res.Layers {
				size += l.Size
				if l.Uploaded {
					uploaded++
				}
			}
			fmt.Fprintf(errw, "imported %s: %d layers (%d uploaded, %d already stored), %s in %.1fs\n",
				args[0], len(res.Layers), uploaded, len(res.Layers)-uploaded, dsec.FormatSize(size), time.Since(start).Seconds())
			fmt.Fprintln(cmd.OutOrStdout(), res.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&platform, "platform", "linux/amd64", "OS/ARCH[/VARIANT] to take from a multi-platform image")
	f.StringVar(&username, "username", "", "registry user name (with --password-stdin)")
	f.BoolVar(&passwordStdin, "password-stdin", false, "read the registry password or token from standard input")
	f.BoolVar(&insecure, "insecure", false, "allow plain HTTP and unverified TLS to the registry")
	f.StringVar(&tmpDir, "tmp-dir", "", "directory for the converted layers until they are uploaded (default $TMPDIR)")
	write.register(f)
	return cmd
}

// apiStore is ociimport's store on the dsec API.
type apiStore struct {
	c     *dsec.Client
	opts  []dsec.ImageOption // how the image is written (--public, --force)
	known map[string]bool    // digests of layers that images reference
}

// HasLayer reports whether an image references the layer: such a layer
// is stored. A stored layer no image references is uploaded again, which
// the server answers without taking the data twice.
func (s *apiStore) HasLayer(ctx context.Context, digest string) (bool, error) {
	if s.known == nil {
		imgs, err := s.c.ListImages(ctx)
		if err != nil {
			return false, err
		}
		s.known = map[string]bool{}
		for _, im := range imgs {
			for _, l := range im.Layers {
				s.known[l.Digest] = true
			}
		}
	}
	return s.known[digest], nil
}

func (s *apiStore) UploadLayer(ctx context.Context, r io.Reader, digest string, size int64) error {
	_, err := s.c.UploadLayer(ctx, r, digest, size)
	return err
}

func (s *apiStore) CreateImage(ctx context.Context, name string, layers []string, cfg ociimport.Config) error {
	_, err := s.c.CreateImage(ctx, name, layers, dsec.ImageConfig{
		Env: cfg.Env, Workdir: cfg.Workdir, User: cfg.User, Entrypoint: cfg.Entrypoint, Cmd: cfg.Cmd,
	}, s.opts...)
	return err
}

// importProgress draws one bar per layer on a terminal, redrawn in place;
// elsewhere it writes one line per finished layer.
type importProgress struct {
	w    io.Writer
	tty  bool
	last time.Time
	line bool // a bar is drawn without its newline
}

func newImportProgress(w io.Writer) *importProgress {
	tty := false
	if f, ok := w.(*os.File); ok {
		tty = isTerminal(f.Fd())
	}
	return &importProgress{w: w, tty: tty}
}

func (p *importProgress) event(e ociimport.Event) {
	head := fmt.Sprintf("layer %d/%d", e.Index+1, e.Count)
	switch e.Phase {
	case ociimport.PhaseConvert, ociimport.PhaseUpload:
		if !p.tty || time.Since(p.last) < 100*time.Millisecond && e.Done < e.Total {
			return
		}
		p.last = time.Now()
		verb := "fetch+convert"
		if e.Phase == ociimport.PhaseUpload {
			verb = "upload"
		}
		fmt.Fprintf(p.w, "\r\033[K%s %-13s %s %s", head, verb, bar(e.Done, e.Total), sizes(e.Done, e.Total))
		p.line = true
	case ociimport.PhaseConverted:
		p.clear()
		l := e.Layer
		fmt.Fprintf(p.w, "%s %s: %d files, %s → %s %s", head, short(l.Source), l.Files, l.MediaType, short(l.Digest), dsec.FormatSize(l.Size))
		if l.Skipped > 0 {
			fmt.Fprintf(p.w, " (%d device nodes, sockets or aufs entries skipped)", l.Skipped)
		}
		fmt.Fprintln(p.w)
	case ociimport.PhaseStored:
		p.clear()
		if e.Layer.Uploaded {
			fmt.Fprintf(p.w, "%s %s uploaded\n", head, short(e.Layer.Digest))
		} else {
			fmt.Fprintf(p.w, "%s %s already stored\n", head, short(e.Layer.Digest))
		}
	}
}

func (p *importProgress) clear() {
	if p.line {
		fmt.Fprint(p.w, "\r\033[K")
		p.line = false
	}
}

func (p *importProgress) finish() { p.clear() }

func bar(done, total int64) string {
	const width = 30
	if total <= 0 {
		return "[" + strings.Repeat("?", width) + "]"
	}
	n := int(min(done, total) * width / total)
	return "[" + strings.Repeat("=", n) + strings.Repeat(" ", width-n) + "]"
}

func sizes(done, total int64) string {
	if total <= 0 {
		return dsec.FormatSize(done)
	}
	return dsec.FormatSize(done) + "/" + dsec.FormatSize(total)
}
