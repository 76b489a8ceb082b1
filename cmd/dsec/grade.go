package main

import (
	"fmt"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

func newGradeCmd(g *globalFlags) *cobra.Command {
	var (
		paths                   []string
		env                     []string
		image, workdir, user    string
		memory, maxCopy, outLim string
		cpus                    float64
		timeout                 time.Duration
		shell, verbose          bool
	)
	cmd := &cobra.Command{
		Use:   "grade ID --copy PATH... [flags] -- CMD...",
		Short: "Grade a sandbox's work in a fresh sandbox, out of its reach",
		Long: `Judge a sandbox's work where the sandbox's own processes cannot reach: a
fresh sandbox is made from the sandbox's original image (its layers, without
anything the sandbox wrote; --image chooses another), only the paths given
with --copy are copied into it from the sandbox (to the same paths; a
directory with everything below it; regular files and directories, symbolic
links copied as links and never followed, anything else refused), CMD runs
there, and the grading sandbox is deleted. The sandbox graded is not changed.
Paths are absolute; --copy repeats, and words between ID and -- are paths
too (dsec grade ID --copy /a /b -- CMD copies both). The command comes after
--; flags may go anywhere before it.

CMD's stdout and stderr are printed, and dsec exits with its code (128+N for
signal N, 124 when --timeout killed it); errors of dsec itself exit 125, bad
usage 2. With --sh, the command words are joined into one line run with
/bin/sh -c. See docs/grading.md for when to use this rather than
dsec exec --sealed.`,
		Example: `  dsec grade ID --copy /workspace -- /workspace/run-tests
  dsec grade ID --copy /repo --image swe-grader:1 -w /repo -- pytest -q /hidden/tests
  dsec grade ID --copy /out/a.txt --copy /out/b.txt --sh -- 'diff /out/a.txt /out/b.txt'`,
		Args: cobra.MinimumNArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			// Flags may follow ID; the command follows "--", and words
			// between ID and "--" are more paths to copy.
			dash := cmd.ArgsLenAtDash()
			if dash < 1 || dash == len(args) {
				return usageErrorf("give the command after --: dsec grade [flags] ID --copy PATH... -- CMD...")
			}
			argv := args[dash:]
			paths := append(append([]string(nil), paths...), args[1:dash]...)
			if len(paths) == 0 {
				return usageErrorf("nothing to grade: name the sandbox's files or directories with --copy PATH (repeatable)")
			}
			opts := dsec.GradeOptions{Image: image, Cwd: workdir, User: user, Timeout: timeout, CPUs: cpus}
			if shell {
				opts.Shell, argv = joinWords(argv), nil
			}
			var err error
			if opts.Env, err = parseKV("--env", env); err != nil {
				return err
			}
			for _, s := range []struct {
				flag, v string
				dst     *int64
			}{{"--memory", memory, &opts.Memory}, {"--max-copy", maxCopy, &opts.MaxCopyBytes}, {"--output-limit", outLim, &opts.OutputLimit}} {
				if s.v == "" {
					continue
				}
				if *s.dst, err = dsec.ParseSize(s.v); err != nil {
					return usageErrorf("%s: %v", s.flag, err)
				}
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			res, err := c.Sandbox(args[0]).GradeFrom(cmd.Context(), paths, argv, opts)
			if err != nil {
				return err
			}
			if _, err := cmd.OutOrStdout().Write(res.Stdout); err != nil {
				return err
			}
			if _, err := cmd.ErrOrStderr().Write(res.Stderr); err != nil {
				return err
			}
			if verbose {
				fmt.Fprintf(cmd.ErrOrStderr(), "dsec: graded in sandbox %s (deleted): %d files, %s copied; %s\n",
					res.GraderSandboxID, res.CopiedFiles, dsec.FormatSize(res.CopiedBytes), gradeStatus(res.ExitStatus))
			}
			if res.StdoutTruncated || res.StderrTruncated {
				fmt.Fprintln(cmd.ErrOrStderr(), "dsec: the grading command's output passed the cap; the rest was dropped")
			}
			if res.Lost {
				return fmt.Errorf("grade of sandbox %s: the grading command's end was lost (its node restarted while it ran): grade again", args[0])
			}
			if code := res.Code(); code != 0 {
				return exitError{code}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringArrayVar(&paths, "copy", nil, "absolute path in the sandbox to copy to the grading sandbox (repeatable; a directory with everything below it)")
	f.StringVar(&image, "image", "", "image of the grading sandbox (default: the sandbox's original image)")
	f.DurationVar(&timeout, "timeout", 0, "kill the command after this long (default 10m)")
	f.StringArrayVarP(&env, "env", "e", nil, "environment variable KEY=VALUE of the command (repeatable)")
	f.StringVarP(&workdir, "workdir", "w", "", "working directory of the command (default: the image's)")
	f.StringVarP(&user, "user", "u", "", "user of the command: NAME, UID or UID:GID (default: the image's)")
	f.BoolVar(&shell, "sh", false, "join the command words into one line run with /bin/sh -c")
	f.StringVar(&memory, "memory", "", "memory limit of the grading sandbox, e.g. 2G (default: the sandbox's)")
	f.Float64Var(&cpus, "cpus", 0, "CPU cap of the grading sandbox in cores (default: the sandbox's)")
	f.StringVar(&maxCopy, "max-copy", "", "most bytes copied, e.g. 4G (default 1G); beyond it the grade fails")
	f.StringVar(&outLim, "output-limit", "", "cap of each output stream, e.g. 64M (default 16M)")
	f.BoolVarP(&verbose, "verbose", "v", false, "also say on stderr what was copied and the grading sandbox's ID")
	return cmd
}

// joinWords joins command words into one shell line.
func joinWords(words []string) string {
	line := ""
	for i, w := range words {
		if i > 0 {
			line += " "
		}
		line += w
	}
	return line
}

// gradeStatus says how a grading command ended.
func gradeStatus(st dsec.ExitStatus) string {
	return execStatus(dsec.ExecInfo{Exit: &st})
}
