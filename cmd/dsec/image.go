package main

import (
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newImageCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "image",
		Short: "Build and list images",
		Long: `Images are ordered lists of read-only EROFS layers, named NAME[:TAG] (tag
latest by default).`,
	}
	cmd.AddCommand(newImageBuildCmd(g), newImageLsCmd(g))
	return cmd
}

func newImageBuildCmd(g *globalFlags) *cobra.Command {
	var (
		fromDir, fromTar, workdir, user string
		env                             []string
	)
	cmd := &cobra.Command{
		Use:   "build NAME[:TAG] (--from-dir DIR | --from-tar FILE)",
		Short: "Build a one-layer image from a directory or a tar archive",
		Long: `Build an EROFS layer from a directory tree (owners, modes, links and xattrs
kept) or from a tar archive (plain or gzip; - reads standard input), upload it,
and register it as NAME[:TAG]. The layer is built here, in pure Go, and stored on
the server by its digest.`,
		Example: `  dsec image build busybox --from-dir ./rootfs
  dsec image build py:3.11 --from-tar rootfs.tar.gz --env PYTHONUNBUFFERED=1 --workdir /work`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if (fromDir == "") == (fromTar == "") {
				return usageErrorf("give exactly one of --from-dir and --from-tar")
			}
			for _, kv := range env {
				if !strings.Contains(kv, "=") {
					return usageErrorf("--env %q: want KEY=VALUE", kv)
				}
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
			if fromDir != "" {
				info, err = layer.BuildFromDir(ctx, fromDir, tmp, opts)
			} else {
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
			img, err := c.CreateImage(ctx, args[0], []string{info.Digest}, dsec.ImageConfig{Env: env, Workdir: workdir, User: user})
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
	f.StringArrayVar(&env, "env", nil, "environment variable KEY=VALUE of the image (repeatable)")
	f.StringVar(&workdir, "workdir", "", "default working directory of execs")
	f.StringVar(&user, "user", "", "default user of execs")
	return cmd
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
			fmt.Fprintln(tw, "NAME\tLAYERS\tSIZE\tCREATED")
			for _, img := range imgs {
				fmt.Fprintf(tw, "%s\t%d\t%s\t%s ago\n", img.Name, len(img.Layers), dsec.FormatSize(img.Size), human(time.Since(img.CreatedAt)))
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
	)
	create := &cobra.Command{
		Use:   "create",
		Short: "Create an API key and print it",
		Long: `Create an API key (admin keys only) and print its secret once. Give it to a
user, who puts it in DSEC_API_KEY or ~/.config/dsec/config.toml (api_key = "...").
A key sees only the sandboxes of its project.`,
		Example: `  dsec key create --name alice --project rl-team`,
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			secret, _, err := c.CreateKey(cmd.Context(), dsec.KeyOptions{Name: name, Project: project, Admin: admin})
			if err != nil {
				return err
			}
			fmt.Fprintln(cmd.OutOrStdout(), secret)
			return nil
		},
	}
	f := create.Flags()
	f.StringVar(&name, "name", "", "a name to recognise the key by")
	f.StringVar(&project, "project", "default", "project whose sandboxes the key sees")
	f.BoolVar(&admin, "admin", false, "make an admin key (sees every project, may create keys)")
	cmd.AddCommand(create)
	return cmd
}
