package main

import (
	"errors"
	"fmt"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// Who may run and rewrite images: --public, --force, `image public` and
// `image private`.

// imageWriteFlags are the flags of every command that writes an image.
type imageWriteFlags struct {
	public, private, force bool
}

func (w *imageWriteFlags) register(f *pflag.FlagSet) {
	f.BoolVar(&w.public, "public", false, "make the image public: every project may run it (default: a new image is private to the key's project, an existing one keeps its visibility)")
	f.BoolVar(&w.private, "private", false, "make the image private: only the key's project (and admin keys) may run it")
	f.BoolVar(&w.force, "force", false, "replace an existing NAME:TAG that has other layers or config (writing the same ones needs no --force)")
}

// options returns the SDK's options for the flags given.
func (w *imageWriteFlags) options() []dsec.ImageOption {
	var opts []dsec.ImageOption
	if w.force {
		opts = append(opts, dsec.WithForce())
	}
	switch {
	case w.public:
		opts = append(opts, dsec.WithPublic(true))
	case w.private:
		opts = append(opts, dsec.WithPublic(false))
	}
	return opts
}

// check refuses --public with --private.
func (w *imageWriteFlags) check() error {
	if w.public && w.private {
		return usageErrorf("give --public or --private, not both")
	}
	return nil
}

func visibility(public bool) string {
	if public {
		return "public"
	}
	return "private"
}

// newImageVisibilityCmd makes `image public` or `image private`.
func newImageVisibilityCmd(g *globalFlags, public bool) *cobra.Command {
	verb, who := "private", "only its own project (and admin keys)"
	if public {
		verb, who = "public", "every project"
	}
	return &cobra.Command{
		Use:   verb + " NAME[:TAG]...",
		Short: "Make images " + verb + ": " + who + " may run them",
		Long: `Make images ` + verb + `: ` + who + ` may then run them. Only the image's project
(or an admin key) may change this. Sandboxes already running are not touched.`,
		Example: "  dsec image " + verb + " busybox sandboxfusion/python:latest",
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var errs []error
			for _, name := range args {
				img, err := c.SetImagePublic(cmd.Context(), name, public)
				if err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", img.Name)
			}
			return errors.Join(errs...)
		},
	}
}
