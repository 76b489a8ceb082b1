package main

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// `dsec key ls` and `dsec key revoke` (`key create` is in image.go).

func newKeyLsCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "ls",
		Short: "List API keys (admin keys only; never their secrets)",
		Long: `List every API key: its ID (what ` + "`dsec key revoke`" + ` takes), name, project,
whether it is an admin key, when it was created and when it expires. Secrets
are never stored, so they cannot be shown.`,
		Example: `  dsec key ls
  dsec key ls -o json`,
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
			keys, err := c.ListKeys(cmd.Context())
			if err != nil {
				return err
			}
			out := cmd.OutOrStdout()
			if output == "json" {
				js := make([]keyJSON, 0, len(keys))
				for _, k := range keys {
					js = append(js, keyJSONOf(k))
				}
				return encodeJSON(out, js)
			}
			now := time.Now()
			tw := tabwriter.NewWriter(out, 2, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tNAME\tPROJECT\tADMIN\tCREATED\tEXPIRES")
			for _, k := range keys {
				admin := "no"
				if k.Admin {
					admin = "yes"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s ago\t%s\n", k.ID, orDash(k.Name), k.Project, admin,
					human(now.Sub(k.CreatedAt)), expiry(k.ExpiresAt, now))
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// expiry describes when a key expires, from now.
func expiry(at, now time.Time) string {
	switch {
	case at.IsZero():
		return "never"
	case !now.Before(at):
		return "expired " + human(now.Sub(at)) + " ago"
	}
	return "in " + human(at.Sub(now))
}

// keyJSON is a key as the API's JSON names its fields.
type keyJSON struct {
	ID        string `json:"id"`
	Name      string `json:"name,omitempty"`
	Project   string `json:"project"`
	Admin     bool   `json:"admin"`
	CreatedAt string `json:"createdAt"`
	ExpiresAt string `json:"expiresAt,omitempty"`
}

func keyJSONOf(k dsec.Key) keyJSON {
	j := keyJSON{ID: k.ID, Name: k.Name, Project: k.Project, Admin: k.Admin, CreatedAt: k.CreatedAt.UTC().Format(time.RFC3339)}
	if !k.ExpiresAt.IsZero() {
		j.ExpiresAt = k.ExpiresAt.UTC().Format(time.RFC3339)
	}
	return j
}

func newKeyRevokeCmd(g *globalFlags) *cobra.Command {
	return &cobra.Command{
		Use:   "revoke KEY_ID...",
		Short: "Revoke API keys (admin keys only); every server refuses them within a second",
		Long: `Delete API keys by ID (the ID column of ` + "`dsec key ls`" + `, the 8 characters after
"dsk_" in the secret). Every API server refuses a revoked key within a second;
its sandboxes keep running (delete them with ` + "`dsec rm`" + ` as an admin).

The admin key in <state-dir>/admin.key is registered again each time ` + "`dsec up`" + `
starts: whoever can read that file is an administrator of the machine.`,
		Example: `  dsec key revoke abcd2345`,
		Args:    cobra.MinimumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var errs []error
			for _, id := range args {
				k, err := c.RevokeKey(cmd.Context(), strings.TrimPrefix(id, "dsk_"))
				if err != nil {
					errs = append(errs, err)
					continue
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s\n", k.ID)
			}
			return errors.Join(errs...)
		},
	}
}

// dayDuration is a duration flag that also takes days ("30d", "1d12h").
type dayDuration struct{ d *time.Duration }

func (v dayDuration) String() string {
	if v.d == nil || *v.d == 0 {
		return ""
	}
	return formatDays(*v.d)
}

func (v dayDuration) Set(s string) error {
	d, err := parseDays(s)
	if err != nil {
		return err
	}
	*v.d = d
	return nil
}

func (dayDuration) Type() string { return "duration" }

// parseDays parses a Go duration that may start with a number of days:
// "30d", "1d12h", "90m".
func parseDays(s string) (time.Duration, error) {
	var days time.Duration
	rest := s
	if i := strings.IndexByte(s, 'd'); i > 0 {
		n, err := strconv.ParseUint(s[:i], 10, 32)
		if err != nil {
			return 0, fmt.Errorf("%q: want a duration like 30d, 12h or 1d12h", s)
		}
		days, rest = time.Duration(n)*24*time.Hour, s[i+1:]
	}
	var d time.Duration
	if rest != "" {
		var err error
		if d, err = time.ParseDuration(rest); err != nil {
			return 0, fmt.Errorf("%q: want a duration like 30d, 12h or 1d12h", s)
		}
	}
	if d < 0 || days+d < 0 {
		return 0, fmt.Errorf("%q: want a positive duration", s)
	}
	return days + d, nil
}

// formatDays writes d with whole days as "Nd" ("7d", "1d12h0m0s").
func formatDays(d time.Duration) string {
	const day = 24 * time.Hour
	if d < day {
		return d.String()
	}
	if d%day == 0 {
		return fmt.Sprintf("%dd", d/day)
	}
	return fmt.Sprintf("%dd%s", d/day, d%day)
}
