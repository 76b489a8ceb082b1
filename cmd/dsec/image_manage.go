package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/layer"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Image housekeeping: rm, inspect, df, gc, push and pull.

func newImageManageCmds(g *globalFlags) []*cobra.Command {
	return []*cobra.Command{
		newImageRmCmd(g), newImageInspectCmd(g), newImageDfCmd(g), newImageGCCmd(g),
		newImageCopyCmd(g, true), newImageCopyCmd(g, false), newImageSquashCmd(g),
	}
}

func newImageRmCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "rm NAME[:TAG]...",
		Short: "Remove images (their layers stay until `dsec image gc`)",
		Long: `Remove images. Their layers stay: shared with other images, or used by
sandboxes, or not. ` + "`dsec image gc`" + ` removes the layers no image references and
no sandbox uses. Only an image's project (or an admin key) may remove it; a
private image of another project is not found.`,
		Example: `  dsec image rm py:3.11 ws/sphinx-9658:1`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var errs []error
			for _, name := range args {
				img, err := c.DeleteImage(cmd.Context(), name)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintln(cmd.OutOrStdout(), img.Name)
			}
			if len(errs) > 0 {
				return errors.Join(errs...)
			}
			return nil
		},
	}
}

func newImageInspectCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "inspect NAME[:TAG]",
		Short: "Show an image: its config, its layers, who else uses them",
		Example: `  dsec image inspect base/py310:3
  dsec image inspect base/py310:3 -o json`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			d, err := c.InspectImage(cmd.Context(), args[0])
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, inspectProto(d))
			}
			img := d.Image
			fmt.Fprintf(out, "Name:       %s\n", img.Name)
			fmt.Fprintf(out, "Project:    %s (%s)\n", img.Project, visibility(img.Public))
			fmt.Fprintf(out, "Created:    %s (%s ago)\n", img.CreatedAt.Format(time.RFC3339), human(time.Since(img.CreatedAt)))
			fmt.Fprintf(out, "Size:       %s in %d layers\n", dsec.FormatSize(img.Size), len(img.Layers))
			cfg := img.Config
			fmt.Fprintf(out, "Workdir:    %s\n", orDash(cfg.Workdir))
			fmt.Fprintf(out, "User:       %s\n", orDash(cfg.User))
			fmt.Fprintf(out, "Entrypoint: %s\n", orDash(strings.Join(cfg.Entrypoint, " ")))
			fmt.Fprintf(out, "Cmd:        %s\n", orDash(strings.Join(cfg.Cmd, " ")))
			fmt.Fprintln(out, "Env:")
			for _, e := range cfg.Env {
				fmt.Fprintf(out, "  %s\n", e)
			}
			fmt.Fprintln(out, "Layers (lowest first):")
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "  #\tDIGEST\tSIZE\tCREATED\tALSO IN\tSANDBOXES")
			for i, l := range d.Layers {
				var others []string
				for _, n := range l.Images {
					if n != img.Name {
						others = append(others, n)
					}
				}
				fmt.Fprintf(tw, "  %d\t%s\t%s\t%s ago\t%s\t%d\n", i, l.Digest, dsec.FormatSize(l.Size),
					human(time.Since(l.CreatedAt)), orDash(strings.Join(others, ",")), len(l.Sandboxes))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func newImageDfCmd(g *globalFlags) *cobra.Command {
	var (
		output  string
		verbose bool
	)
	cmd := &cobra.Command{
		Use:   "df",
		Short: "Show the layer store's disk usage",
		Long: `Show how many layers the store holds and their bytes: shared by several
images, unique to one, unreferenced but used by a sandbox, and reclaimable
(` + "`dsec image gc`" + ` would remove them once past its grace period).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			du, err := c.DiskUsage(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, diskUsageProto(du))
			}
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "LAYERS\tCOUNT\tSIZE")
			fmt.Fprintf(tw, "shared (2+ images)\t%d\t%s\n", du.SharedCount, dsec.FormatSize(du.SharedBytes))
			fmt.Fprintf(tw, "unique (1 image)\t%d\t%s\n", du.UniqueCount, dsec.FormatSize(du.UniqueBytes))
			fmt.Fprintf(tw, "no image, in use\t%d\t%s\n", du.UnreferencedInUseCount, dsec.FormatSize(du.UnreferencedInUseBytes))
			fmt.Fprintf(tw, "reclaimable\t%d\t%s\n", du.ReclaimableCount, dsec.FormatSize(du.ReclaimableBytes))
			fmt.Fprintf(tw, "total\t%d\t%s\n", du.LayerCount, dsec.FormatSize(du.TotalBytes))
			if err := tw.Flush(); err != nil {
				return err
			}
			fmt.Fprintf(out, "%d images, %d sandboxes\n", du.Images, du.Sandboxes)
			if !verbose {
				return nil
			}
			tw = tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "\nDIGEST\tSIZE\tIMAGES\tSANDBOXES")
			for _, l := range du.Layers {
				fmt.Fprintf(tw, "%s\t%s\t%s\t%d\n", l.Digest, dsec.FormatSize(l.Size), orDash(strings.Join(l.Images, ",")), len(l.Sandboxes))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "list every layer")
	return cmd
}

func newImageGCCmd(g *globalFlags) *cobra.Command {
	var (
		dry    bool
		grace  time.Duration
		output string
	)
	cmd := &cobra.Command{
		Use:   "gc [--dry-run] [--grace DURATION]",
		Short: "Remove the layers no image references and no sandbox uses",
		Long: `Remove the layers that no image references and no sandbox on any node
uses (admin keys only): their records and their blobs. Layers created, or
released by a removed or replaced image, less than --grace ago are kept, so
that a build, pull or create in progress finds its layers. Every node must
answer: a node that does not could be using any layer.`,
		Example: `  dsec image gc --dry-run
  dsec image gc --grace 0s   # nothing is being built or created`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			opts := dsec.GCOptions{DryRun: dry}
			if cmd.Flags().Changed("grace") {
				if grace < 0 {
					return usageErrorf("--grace %s: want 0 or more", grace)
				}
				opts.Grace = &grace
			}
			res, err := c.GarbageCollect(cmd.Context(), opts)
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(out, gcProto(res))
			}
			verb := "removed"
			if dry {
				verb = "would remove"
			}
			for _, l := range res.Removed {
				fmt.Fprintf(out, "%s %s (%s)\n", verb, l.Digest, dsec.FormatSize(l.Size))
			}
			for _, b := range res.OrphanBlobs {
				fmt.Fprintf(out, "%s orphan blob %s (%s): no layer names it\n", verb, b.Digest, dsec.FormatSize(b.Size))
			}
			for _, k := range res.Kept {
				fmt.Fprintf(out, "kept %s (%s): %s\n", k.Digest, dsec.FormatSize(k.Size), k.Reason)
			}
			fmt.Fprintf(out, "%s %d layers, %s\n", verb, len(res.Removed), dsec.FormatSize(res.RemovedBytes))
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&dry, "dry-run", false, "report what would be removed, remove nothing")
	f.DurationVar(&grace, "grace", 10*time.Minute, "keep layers created or released less than this long ago")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// newImageCopyCmd makes `image push` (push: local to --to) or `image
// pull` (--from to local).
func newImageCopyCmd(g *globalFlags, push bool) *cobra.Command {
	var (
		addr, key, stateDir string
		write               imageWriteFlags
	)
	verb, flag, dir := "pull", "from", "from another dsec API server to this one"
	if push {
		verb, flag, dir = "push", "to", "from this dsec API server to another"
	}
	cmd := &cobra.Command{
		Use:   verb + " NAME[:TAG] --" + flag + " ADDR",
		Short: "Copy an image and its layers " + dir,
		Long: `Copy an image, its layers and its config ` + dir + `, each with its own
layer store. Layers the target already has are skipped; the others stream
through this machine and are checked against their digests on arrival. The
image is registered on the target only once every layer arrived, owned by the
project of the target's key (--public, --private and --force say how).

The other server's key comes from --` + flag + `-key, or from the admin.key of
--` + flag + `-state-dir.`,
		Example: "  dsec image " + verb + " base/py310:3 --" + flag + " http://10.0.0.7:7420 --" + flag + "-key dsec_...",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := write.check(); err != nil {
				return err
			}
			if addr == "" {
				return usageErrorf("--%s ADDR is required", flag)
			}
			if key == "" && stateDir != "" {
				b, err := os.ReadFile(filepath.Join(stateDir, "admin.key"))
				if err != nil {
					return usageErrorf("--%s-state-dir: %v", flag, err)
				}
				key = strings.TrimSpace(string(b))
			}
			local, err := g.client()
			if err != nil {
				return err
			}
			defer local.Close()
			remote, err := dsec.New(dsec.Config{Addr: addr, APIKey: key})
			if err != nil {
				return err
			}
			defer remote.Close()
			src, dst := remote, local
			if push {
				src, dst = local, remote
			}
			errw := cmd.ErrOrStderr()
			start := time.Now()
			var copied, skipped int
			var bytes int64
			img, err := dsec.CopyImage(cmd.Context(), src, dst, args[0], func(i, n int, l dsec.Layer, done int64, skip bool) {
				switch {
				case skip:
					fmt.Fprintf(errw, "layer %d/%d %s: already there\n", i+1, n, short(l.Digest))
					skipped++
				case done == l.Size:
					fmt.Fprintf(errw, "\rlayer %d/%d %s: %s      \n", i+1, n, short(l.Digest), dsec.FormatSize(l.Size))
					copied++
					bytes += l.Size
				default:
					fmt.Fprintf(errw, "\rlayer %d/%d %s: %s of %s", i+1, n, short(l.Digest), dsec.FormatSize(done), dsec.FormatSize(l.Size))
				}
			}, write.options()...)
			if err != nil {
				return err
			}
			fmt.Fprintf(errw, "%sed %s: %d layers copied (%s), %d already there, in %.1fs\n",
				verb, img.Name, copied, dsec.FormatSize(bytes), skipped, time.Since(start).Seconds())
			fmt.Fprintln(cmd.OutOrStdout(), img.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&addr, flag, "", "API address of the other dsec server (http://HOST:PORT)")
	f.StringVar(&key, flag+"-key", "", "API key for the other server")
	f.StringVar(&stateDir, flag+"-state-dir", "", "read the other server's admin.key from this state dir (a server on this machine)")
	write.register(f)
	return cmd
}

func newImageSquashCmd(g *globalFlags) *cobra.Command {
	var (
		to, maxSize string
		write       imageWriteFlags
	)
	cmd := &cobra.Command{
		Use:   "squash NAME[:TAG] --to NAME[:TAG]",
		Short: "Collapse runs of small consecutive layers of an image into one layer each",
		Long: `Register a copy of an image in which every run of two or more consecutive
layers smaller than --max-layer-size is replaced by one layer showing the same
files (a sandbox sees the same tree). Whiteouts and opaque directories that hide
files of lower layers are kept. The layers are downloaded, merged here (no root
needed) and uploaded; the image keeps its config. Fewer layers make overlay
lookups and mounts cheaper; the image cannot have more than 127.`,
		Example: `  dsec image squash ws/sphinx-9658:7 --to ws/sphinx-9658:7-squashed`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if to == "" {
				return usageErrorf("--to NAME[:TAG] is required")
			}
			if err := write.check(); err != nil {
				return err
			}
			limit, err := dsec.ParseSize(maxSize)
			if err != nil || limit <= 0 {
				return usageErrorf("--max-layer-size %q: want a size like 64M", maxSize)
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			ctx := cmd.Context()
			img, err := c.GetImage(ctx, args[0])
			if err != nil {
				return err
			}
			tmp, err := os.MkdirTemp("", "dsec-squash-")
			if err != nil {
				return err
			}
			defer os.RemoveAll(tmp)
			errw := cmd.ErrOrStderr()
			var digests []string
			for i := 0; i < len(img.Layers); {
				j := i
				for j < len(img.Layers) && img.Layers[j].Size < limit {
					j++
				}
				if j-i < 2 {
					digests = append(digests, img.Layers[i].Digest)
					i++
					continue
				}
				d, err := squashRun(ctx, c, img.Layers[i:j], tmp)
				if err != nil {
					return err
				}
				fmt.Fprintf(errw, "layers %d-%d → %s\n", i+1, j, short(d))
				digests = append(digests, d)
				i = j
			}
			if len(digests) == len(img.Layers) {
				fmt.Fprintf(errw, "no two consecutive layers under %s: registering the same layers\n", dsec.FormatSize(limit))
			}
			out, err := c.CreateImage(ctx, to, digests, img.Config, write.options()...)
			if err != nil {
				return err
			}
			fmt.Fprintf(errw, "%s: %d layers (%s), was %d (%s)\n", out.Name, len(out.Layers), dsec.FormatSize(out.Size), len(img.Layers), dsec.FormatSize(img.Size))
			fmt.Fprintln(cmd.OutOrStdout(), out.Name)
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "name of the squashed image")
	f.StringVar(&maxSize, "max-layer-size", "64M", "layers at least this big are kept as they are")
	write.register(f)
	return cmd
}

// squashRun downloads layers (verified against their digests), merges them
// into one, uploads it and returns its digest.
func squashRun(ctx context.Context, c *dsec.Client, layers []dsec.Layer, tmp string) (string, error) {
	var files []io.ReaderAt
	for i, l := range layers {
		f, err := os.Create(filepath.Join(tmp, fmt.Sprintf("in-%d", i)))
		if err != nil {
			return "", err
		}
		defer f.Close()
		_, rc, err := c.DownloadLayer(ctx, l.Digest)
		if err != nil {
			return "", err
		}
		_, err = io.Copy(f, rc)
		rc.Close()
		if err != nil {
			return "", fmt.Errorf("download layer %s: %w", l.Digest, err)
		}
		files = append(files, f)
	}
	out, err := os.Create(filepath.Join(tmp, "out"))
	if err != nil {
		return "", err
	}
	defer out.Close()
	info, err := layer.Squash(ctx, files, out, layer.Options{TempDir: tmp})
	if err != nil {
		return "", err
	}
	if _, err := out.Seek(0, io.SeekStart); err != nil {
		return "", err
	}
	if _, err := c.UploadLayer(ctx, out, info.Digest, info.Size); err != nil {
		return "", err
	}
	return info.Digest, nil
}
