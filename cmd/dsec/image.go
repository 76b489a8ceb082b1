package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/debian"
	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newImageCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build and list images",
		Long: `Images are ordered lists of read-only EROFS layers, named NAME[:TAG] (tag
latest by default).

An image belongs to the project of the key that made it: only that project
(or an admin key) removes it, writes onto its name or changes its visibility.
A private image (the default) runs only for its project; one built, imported
or packed with --public, or made public with ` + "`dsec image public`" + `, runs for
every project. Writing other layers or config onto an existing NAME:TAG needs
--force; writing the same ones again changes nothing, so scripts can re-run.`,
	}
	cmd.AddCommand(newImageBuildCmd(g), newImageLsCmd(g), imageImportCmd(g))
	cmd.AddCommand(newImageManageCmds(g)...)
	cmd.AddCommand(newImageVisibilityCmd(g, true), newImageVisibilityCmd(g, false))
	return cmd
}

func newImageBuildCmd(g *globalFlags) *cobra.Command {
	var (
		fromDir, fromTar, workdir, user string
		debPkgs, suite, variant         string
		env, runs                       []string
		keepDocs                        bool
		write                           imageWriteFlags
	)
	cmd := &cobra.Command{
		Use:   "build NAME[:TAG] (--from-dir DIR | --from-tar FILE | --debian PKG[,PKG…])",
		Short: "Build a one-layer image from a directory, a tar archive or Debian packages",
		Long: `Build an EROFS layer from a directory tree (owners, modes, links and xattrs
kept), from a tar archive (plain or gzip; - reads standard input), or from Debian
packages, upload it, and register it as NAME[:TAG]. The layer is built here, in
pure Go, and stored on the server by its digest.

--debian installs the packages and their dependencies into a new root file
system with mmdebstrap (apt-get install mmdebstrap), from this machine's own apt
sources (/etc/apt/sources.list and sources.list.d): no mirror is named, so the
build reaches what this machine's apt reaches. It runs as root, or unprivileged
with mmdebstrap's unshare mode (which needs a range in /etc/subuid). --run
commands then run inside the new root, for example to warm a compiler's cache.`,
		Example: `  dsec image build busybox --from-dir ./rootfs --public
  dsec image build py:3.11 --from-tar rootfs.tar.gz --env PYTHONUNBUFFERED=1 --workdir /work
  dsec image build sandboxfusion/python --debian python3
  dsec image build sandboxfusion/bash --debian bash,coreutils,grep,sed,gawk,bc
  dsec image build sandboxfusion/go --debian golang-go --env CGO_ENABLED=0 \
      --env GOCACHE=/var/cache/go-build --run 'go build std'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := write.check(); err != nil {
				return err
			}
			n := 0
			for _, s := range []string{fromDir, fromTar, debPkgs} {
				if s != "" {
					n++
				}
			}
			if n != 1 {
				return usageErrorf("give exactly one of --from-dir, --from-tar and --debian")
			}
			if debPkgs == "" && (len(runs) > 0 || suite != "" || variant != "" || keepDocs) {
				return usageErrorf("--run, --suite, --variant and --keep-docs go with --debian")
			}
			for _, kv := range env {
				if !strings.Contains(kv, "=") {
					return usageErrorf("--env %q: want KEY=VALUE", kv)
				}
			}
			var deb debian.Options
			if debPkgs != "" {
				pkgs, err := debian.ParsePackages(debPkgs)
				if err != nil {
					return usageErrorf("--debian: %v", err)
				}
				deb = debian.Options{Packages: pkgs, Suite: suite, Variant: variant, Customize: runs, Env: env, KeepDocs: keepDocs}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			errw := cmd.ErrOrStderr()
			tmp, err := os.CreateTemp("", "dsec-layer-*.erofs")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			defer tmp.Close()
			start := time.Now()
			last := time.Now()
			opts := layer.Options{Progress: func(files int, bytes int64) {
				if time.Since(last) > 500*time.Millisecond {
					last = time.Now()
					fmt.Fprintf(errw, "\rbuilding layer: %d files, %s", files, dsec.FormatSize(bytes))
				}
			}}
			var info layer.Info
			switch {
			case fromDir != "":
				info, err = layer.BuildFromDir(ctx, fromDir, tmp, opts)
			case debPkgs != "":
				info, err = buildDebian(ctx, deb, tmp, opts, errw)
			default:
				in := cmd.InOrStdin()
				if fromTar != "-" {
					f, oerr := os.Open(fromTar)
					if oerr != nil {
						return oerr
					}
					defer f.Close()
					in = f
				}
				info, err = layer.BuildFromTar(ctx, in, tmp, opts)
			}
			if err != nil {
				return err
			}
			fmt.Fprintf(errw, "\rbuilt layer %s: %d files, %s in %.1fs", short(info.Digest), info.Files, dsec.FormatSize(info.Size), time.Since(start).Seconds())
			if info.Skipped > 0 {
				fmt.Fprintf(errw, " (%d device nodes or sockets skipped)", info.Skipped)
			}
			fmt.Fprintln(errw)
			if _, err := tmp.Seek(0, 0); err != nil {
				return err
			}
			if _, err := c.UploadLayer(ctx, tmp, info.Digest, info.Size); err != nil {
				return err
			}
			img, err := c.CreateImage(ctx, args[0], []string{info.Digest}, dsec.ImageConfig{Env: env, Workdir: workdir, User: user}, write.options()...)
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), img.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&fromDir, "from-dir", "", "build from this directory tree")
	f.StringVar(&fromTar, "from-tar", "", "build from this tar archive (plain or gzip; - for stdin)")
	f.StringVar(&debPkgs, "debian", "", "build from these Debian packages (comma-separated, with their dependencies) with mmdebstrap")
	f.StringVar(&suite, "suite", "", "Debian release of --debian (default: this machine's)")
	f.StringVar(&variant, "variant", "", "mmdebstrap's starting package set for --debian: essential (default), apt, minbase, required, important, standard")
	f.StringArrayVar(&runs, "run", nil, "shell command run inside the new root after --debian installed the packages, with the --env variables (repeatable)")
	f.BoolVar(&keepDocs, "keep-docs", false, "keep documentation, man pages and translations that --debian leaves out")
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE of the image (repeatable)")
	f.StringVar(&workdir, "workdir", "", "default working directory of execs")
	f.StringVar(&user, "user", "", "default user of execs")
	write.register(f)
	return cmd
}

// buildDebian builds a layer from Debian packages: mmdebstrap's tar stream
// goes straight into the layer builder, its progress lines to errw.
func buildDebian(ctx context.Context, opts debian.Options, out io.WriteSeeker, lopts layer.Options, errw io.Writer) (layer.Info, error) {
	// Stop mmdebstrap cleanly on Ctrl-C: it then unmounts and removes its
	// temporary root.
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	start := time.Now()
	fmt.Fprintf(errw, "installing %s with mmdebstrap from this machine's apt sources\n", strings.Join(opts.Packages, ", "))
	opts.Log = &prefixWriter{w: errw, start: start}
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := debian.Build(ctx, opts, pw)
		pw.CloseWithError(err)
		done <- err
	}()
	info, err := layer.BuildFromTar(ctx, pr, out, lopts)
	if err == nil {
		// The layer builder stops at the archive's end marker; read the
		// padding after it, so that mmdebstrap's last writes succeed.
		_, _ = io.Copy(io.Discard, pr)
	}
	pr.CloseWithError(errors.New("the layer build stopped reading"))
	berr := <-done
	if err != nil {
		return layer.Info{}, err
	}
	if berr != nil {
		return layer.Info{}, berr
	}
	return info, nil
}

// prefixWriter writes lines prefixed with the seconds since start.
type prefixWriter struct {
	w     io.Writer
	start time.Time
	part  []byte
}

func (p *prefixWriter) Write(b []byte) (int, error) {
	p.part = append(p.part, b...)
	for {
		i := bytes.IndexByte(p.part, '\n')
		if i < 0 {
			return len(b), nil
		}
		fmt.Fprintf(p.w, "[%5.1fs] %s\n", time.Since(p.start).Seconds(), p.part[:i])
		p.part = p.part[i+1:]
	}
}

func short(digest string) string {
	if len(digest) > 19 {
		return digest[:19]
	}
	return digest
}

func newImageLsCmd(g *globalFlags) *cobra.Command {
	var quiet bool
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List images",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			imgs, err := c.ListImages(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if quiet {
				for _, img := range imgs {
					fmt.Fprintln(out, img.Name)
				}
				return nil
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tLAYERS\tSIZE\tCREATED\tPROJECT\tVISIBILITY")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s ago\t%s\t%s\n", img.Name, len(img.Layers), dsec.FormatSize(img.Size),
					human(time.Since(img.CreatedAt)), img.Project, visibility(img.Public))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().BoolVarP(&quiet, "quiet", "q", false, "print only names")
	return cmd
}

func newKeyCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "key",
		Short: "Manage API keys",
	}
	var (
		name, project string
		admin         bool
		expires       time.Duration
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it",
		Long: `Create an API key (admin keys only) and print its secret once. Give it to a
user, who puts it in DSEC_API_KEY or ~/.config/dsec/config.toml (api_key = "...").
A key sees only the sandboxes of its project. With --expires it stops working
after that long (refused with a message saying it expired); ` + "`dsec key revoke`" + `
ends it at once.`,
		Example: `  dsec key create --name alice --project rl-team
  dsec key create --name ci --project rl-team --expires 30d`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			secret, _, err := c.CreateKey(cmd.Context(), dsec.KeyOptions{Name: name, Project: project, Admin: admin, ExpiresIn: expires})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&name, "name", "", "a name to recognise the key by")
	f.StringVar(&project, "project", "default", "project whose sandboxes the key sees (names starting with dsec- are reserved for the platform)")
	f.BoolVar(&admin, "admin", false, "make an admin key (sees every project but the platform's reserved ones, may create keys)")
	f.Var(dayDuration{&expires}, "expires", "the key stops working this long from now (e.g. 30d, 12h; default: never)")
	cmd.AddCommand(create, newKeyLsCmd(g), newKeyRevokeCmd(g))
	return cmd
}
