//go:build !dsec_client

package main

import (
	"os"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/doctor"
	"github.com/dsecproject/dsec/internal/rootfs"
	"github.com/dsecproject/dsec/internal/server"
)

func newDoctorCmd(g *globalFlags) *cobra.Command {
	var (
		asJSON            bool
		runtime, listen   string
		uidBase, uidCount uint32
		uidRanges         int
	)
	cmd := &cobra.Command{
		Use:   "doctor",
		Short: verbShort("doctor"),
		Long: `Check that this machine has what "dsec up" needs, and say for each missing
thing what to do. Run it as root, with the flags you give "dsec up".

It probes for real where it can, and leaves nothing behind (mounts are made
in a private mount namespace and undone, temporary files removed):
  root                 dsec needs root
  kernel               its version (file-backed EROFS mounts arrived in 6.12)
  erofs, overlay fs    in /proc/filesystems or available as modules
  xfs, fuse fs         optional: disk limits, lazily fetched layers
  erofs mount          an EROFS image it builds mounts straight from its file
  idmapped mount       that mount gets an idmapped view for the uid range
  overlay on idmap     overlayfs over that view writes and copies up
  user namespaces      enabled, and a sandbox's can be made by its own host uid
  uid range            the sandboxes' ranges fit in 32 bits and overlap no
                       /etc/subuid or /etc/subgid entry
  cgroup layout        v1, hybrid or unified
  cgroup controllers   memory and pids (required), cpu, freezer, cgroup2 kill
  oci runtime          crun and/or runc, their versions
  dsec binary          static, with the sandbox init (make build)
  openat2, pidfd       the system calls file operations and execs use
  seccomp              a filter can be installed
  loop devices         optional: /dev/loop-control, for disk limits
  mkfs.xfs             optional: xfsprogs, for disk limits
  open files           the hard RLIMIT_NOFILE, and how many execs it allows
  pid_max, memory, swap  what the node can hold
  state dir            exists or can be made; every directory above it
                       can be traversed by others (sandboxes need it)
  disk space           free space for the state dir (warns under 10 GiB)
  api address          --listen is free, or a running dsec serves it

Each line reads "✓ name detail" (fine), "! ..." (works, with a limit) or
"✗ ..." (fails); what to do follows the table.

Exit status: 0 when no required check failed, 1 otherwise.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			self, err := os.Executable()
			if err != nil {
				self = ""
			}
			r := doctor.Run(cmd.Context(), doctor.Env{
				StateDir: g.resolvedStateDir(),
				Runtime:  runtime,
				IDMap:    rootfs.IDMap{HostID: uidBase, Size: uidCount}, UIDRanges: uidRanges,
				Binary: self,
				Listen: listen,
			})
			if asJSON {
				err = r.WriteJSON(cmd.OutOrStdout())
			} else {
				err = r.WriteText(cmd.OutOrStdout())
			}
			if err != nil {
				return err
			}
			if !r.OK {
				return exitError{code: 1}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, `print the report as JSON: {"ok": bool, "checks": [{"name", "required", "status", "detail", "fix"}]}`)
	f.StringVar(&runtime, "runtime", "", "OCI runtime dsec up will use: crun, runc or a path (default: crun if installed, else runc)")
	f.Uint32Var(&uidBase, "uid-base", rootfs.Default.HostID, "first host uid/gid of the sandboxes' id ranges (as dsec up --uid-base)")
	f.Uint32Var(&uidCount, "uid-count", rootfs.Default.Size, "uids/gids per sandbox (as dsec up --uid-count)")
	f.IntVar(&uidRanges, "uid-ranges", 0, "how many sandbox id ranges follow --uid-base (as dsec up --uid-ranges; 0: 16384)")
	f.StringVar(&listen, "listen", server.DefaultListen, "API address dsec up will listen on (host:port)")
	return cmd
}
