package main

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// networkFlagHelp is the help of --network on run and of net set.
const networkFlagHelp = "network egress by intent: none (default: loopback only), allow=pypi,github[,deny=npm], open[,deny=...] or policy=FILE.json (see docs/network.md)"

// networkOption parses a --network value; "" and none are no network.
// The syntax is checked here, so a typo fails before anything is made; the
// server checks the services against its catalogue.
func networkOption(value string) (*dsec.NetworkPolicy, error) {
	if value == "" {
		return nil, nil
	}
	f, err := netpolicy.ParseNetworkFlag(value)
	if err != nil {
		return nil, usageErrorf("--network: %v", err)
	}
	spec := f.Spec
	if f.File != "" {
		data, err := readPolicyFile(f.File)
		if err != nil {
			return nil, err
		}
		if spec, err = netpolicy.ParsePolicyJSON(data); err != nil {
			return nil, usageErrorf("--network policy=%s: %v", f.File, err)
		}
	}
	if spec.Mode == netpolicy.ModeNone {
		return nil, nil
	}
	return policyOfSpec(spec), nil
}

// readPolicyFile reads a policy document of at most netpolicy.MaxDocBytes.
func readPolicyFile(path string) ([]byte, error) {
	fh, err := os.Open(path)
	if err != nil {
		return nil, usageErrorf("--network policy=%s: %v", path, errors.Unwrap(err))
	}
	defer fh.Close()
	data, err := io.ReadAll(io.LimitReader(fh, netpolicy.MaxDocBytes+1))
	if err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	if len(data) > netpolicy.MaxDocBytes {
		return nil, usageErrorf("--network policy=%s: the file is larger than %d bytes", path, netpolicy.MaxDocBytes)
	}
	return data, nil
}

// policyOfSpec is a parsed policy in the SDK's form.
func policyOfSpec(spec netpolicy.Spec) *dsec.NetworkPolicy {
	out := &dsec.NetworkPolicy{Mode: string(spec.Mode)}
	for _, r := range spec.Rules {
		pr := dsec.NetworkRule{Action: string(r.Action), Service: r.Service, Domain: r.Domain, Protocol: string(r.Protocol)}
		if r.CIDR.IsValid() {
			pr.CIDR = r.CIDR.String()
		}
		for _, p := range r.Ports {
			pr.Ports = append(pr.Ports, p.String())
		}
		out.Rules = append(out.Rules, pr)
	}
	return out
}

// setPolicy is the policy of `dsec net set`'s flags: --network, or the
// --allow and --deny targets (allows first), or --open, or --none.
func setPolicy(network string, allow, deny []string, open, none bool) (*dsec.NetworkPolicy, error) {
	given := 0
	for _, b := range []bool{network != "", len(allow)+len(deny) > 0 || open, none} {
		if b {
			given++
		}
	}
	switch {
	case given == 0:
		return nil, usageErrorf("say what the sandbox may reach: --allow SERVICE, --deny SERVICE, --open, --none or --network VALUE")
	case given > 1:
		return nil, usageErrorf("give --network, --allow/--deny/--open or --none, not several")
	case none:
		return &dsec.NetworkPolicy{Mode: "none"}, nil
	case network != "":
		p, err := networkOption(network)
		if p == nil && err == nil {
			p = &dsec.NetworkPolicy{Mode: "none"}
		}
		return p, err
	}
	var clauses []string
	if open {
		clauses = append(clauses, "open")
	}
	for _, a := range allow {
		clauses = append(clauses, "allow="+a)
	}
	for _, d := range deny {
		clauses = append(clauses, "deny="+d)
	}
	value := strings.Join(clauses, ",")
	f, err := netpolicy.ParseNetworkFlag(value)
	if err != nil {
		return nil, usageErrorf("%v", err)
	}
	if f.File != "" {
		return nil, usageErrorf("--allow policy=FILE: use --network policy=FILE")
	}
	return policyOfSpec(f.Spec), nil
}

func newNetCmd(g *globalFlags) *cobra.Command {
	cmd := &cobra.Command{
		Use:   "net",
		Short: "Show and change sandboxes' network policies",
		Long: `A sandbox has no network (loopback only) unless its policy allows egress, by
intent: services of the node's catalogue (pypi, npm, github, goproxy, apt,
huggingface, dockerhub, and the operator's), domains (example.com,
*.example.com) and CIDRs, with ports and protocol. The default is deny, deny
wins, the most specific rule decides (docs/network.md). Set it at create with
dsec run --network, change it while the sandbox runs with dsec net set, and see
why a connection failed with dsec net log.`,
	}
	cmd.AddCommand(newNetSetCmd(g), newNetShowCmd(g), newNetLogCmd(g))
	return cmd
}

func newNetSetCmd(g *globalFlags) *cobra.Command {
	var (
		selector, allow, deny []string
		network, output       string
		merge, open, none     bool
	)
	cmd := &cobra.Command{
		Use:   "set ID|-l k=v [--merge] [--allow TARGET]... [--deny TARGET]...",
		Short: "Change the network policy of a sandbox, or of every sandbox a selector matches",
		Long: `Replace the network policy of sandbox ID, or of every sandbox matching the
labels of -l (repeatable, ANDed), with the rules given; with --merge, add them
to each sandbox's policy instead. The change applies to new connections at once;
established connections the new policy no longer allows are cut.

A TARGET is a service (pypi), a domain (example.com, *.example.com) or a CIDR
(10.0.0.0/8), optionally with ports (:443, :8000-8100, :80+443) and /udp (UDP
only to a CIDR); --allow and --deny take one or several, separated by commas.
--network takes a whole policy as dsec run --network does.

Prints each sandbox's ID and the policy now in force; a sandbox whose update
failed is named on standard error and dsec exits 125.`,
		Example: `  dsec net set ID --allow pypi,github --deny npm
  dsec net set ID --merge --allow huggingface
  dsec net set -l stage=solve --none
  dsec net set -l stage=test --network policy=test.json`,
		Args: cobra.MaximumNArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sel, err := parseKV("-l", selector)
			if err != nil {
				return err
			}
			switch {
			case len(args) == 0 && len(sel) == 0:
				return usageErrorf("name a sandbox ID or a label selector (-l k=v)")
			case len(args) > 0 && len(sel) > 0:
				return usageErrorf("give an ID or -l, not both")
			}
			if err := checkOutput(output); err != nil {
				return err
			}
			pol, err := setPolicy(network, allow, deny, open, none)
			if err != nil {
				return err
			}
			if merge && pol.Mode == "none" && len(pol.Rules) == 0 {
				return usageErrorf("--merge adds rules: give --allow or --deny, or set --none without --merge")
			}
			c, err := g.client()
			if err != nil {
				return err
			}
			defer c.Close()
			var results []dsec.NetworkResult
			if len(args) > 0 {
				got, err := c.Sandbox(args[0]).UpdateNetwork(cmd.Context(), pol, merge)
				if err != nil {
					return err
				}
				results = []dsec.NetworkResult{{ID: args[0], Policy: got}}
			} else if results, err = c.UpdateNetwork(cmd.Context(), sel, pol, merge); err != nil {
				return err
			}
			return printNetworkResults(cmd.OutOrStdout(), cmd.ErrOrStderr(), results, output)
		},
	}
	f := cmd.Flags()
	f.StringArrayVarP(&selector, "label", "l", nil, "update sandboxes with label k=v (repeatable, ANDed)")
	f.StringArrayVar(&allow, "allow", nil, "allow TARGET: a service, domain or CIDR, with :PORTS and /udp (repeatable, comma-separated)")
	f.StringArrayVar(&deny, "deny", nil, "deny TARGET (repeatable, comma-separated)")
	f.BoolVar(&open, "open", false, "allow all public egress but what --deny denies, where the operator permits it")
	f.BoolVar(&none, "none", false, "take the network away: loopback only")
	f.StringVar(&network, "network", "", "the whole policy, as dsec run --network takes it (allow=pypi,deny=npm, open, policy=FILE.json)")
	f.BoolVar(&merge, "merge", false, "add the rules to each sandbox's policy instead of replacing it")
	f.StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

// printNetworkResults prints one line per sandbox (or the results as the
// API's JSON); a failed update is named on w2 and makes the exit 125.
func printNetworkResults(w, w2 io.Writer, results []dsec.NetworkResult, output string) error {
	var failed error
	for _, r := range results {
		if r.Err != nil && failed == nil {
			failed = r.Err
		}
	}
	if output == "json" {
		if err := encodeProtos(w, results, networkResultProto); err != nil {
			return err
		}
	} else {
		for _, r := range results {
			if r.Err != nil {
				fmt.Fprintf(w2, "dsec: %s: %v\n", r.ID, r.Err)
				continue
			}
			fmt.Fprintf(w, "%s\t%s\n", r.ID, r.Policy)
		}
	}
	if failed != nil {
		return exitError{exitCodeOf(failed)}
	}
	return nil
}

func newNetShowCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "show ID",
		Short: "Show a sandbox's network: policy, address and counters",
		Long: `Show the network policy of sandbox ID (in dsec run --network's syntax), its
address and gateway, and its counters: bytes and connections out and in,
connections refused, name lookups and lookups refused. dsec net log lists the
recent refusals.`,
		Example: `  dsec net show ID
  dsec net show -o json ID`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			info, err := netInfo(cmd, g, args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				return encodeProto(w, networkInfoProto(info))
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintf(tw, "policy:\t%s\n", info.Policy)
			addr := info.Address
			if addr == "" {
				addr = "none (loopback only)"
			}
			fmt.Fprintf(tw, "address:\t%s\n", addr)
			if info.Gateway != "" {
				fmt.Fprintf(tw, "gateway:\t%s\n", info.Gateway)
			}
			fmt.Fprintf(tw, "out:\t%s, %d connections (%d open)\n", dsec.FormatSize(info.BytesOut), info.ConnectionsOut, info.ConnectionsActive)
			fmt.Fprintf(tw, "in:\t%s\n", dsec.FormatSize(info.BytesIn))
			fmt.Fprintf(tw, "denied:\t%d (see dsec net log %s)\n", info.Denied, args[0])
			fmt.Fprintf(tw, "lookups:\t%d, %d refused\n", info.DNSQueries, info.DNSDenied)
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func newNetLogCmd(g *globalFlags) *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "log ID",
		Short: "List a sandbox's recent denied connections and lookups",
		Long: `List the recent connections and name lookups sandbox ID's network policy
refused, oldest first: when, the destination (ADDR:PORT/tcp, ADDR:PORT/udp, or
the name looked up), the name the connection gave (TLS SNI or HTTP Host) and
why (the rule that denied it, or that none allowed it). This is where to look
when pip or git fails in a sandbox.`,
		Example: `  dsec net log ID
  dsec net log -o json ID`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := checkOutput(output); err != nil {
				return err
			}
			info, err := netInfo(cmd, g, args[0])
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if output == "json" {
				return encodeProtos(w, info.Denials, networkDenialProto)
			}
			if len(info.Denials) == 0 {
				fmt.Fprintln(cmd.ErrOrStderr(), "no denials")
				return nil
			}
			tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "TIME\tDESTINATION\tNAME\tREASON")
			for _, d := range info.Denials {
				name := d.Name
				if name == "" {
					name = "-"
				}
				fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", d.Time.Local().Format(time.DateTime), d.Destination, name, d.Reason)
			}
			return tw.Flush()
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "table", "output format: table or json")
	return cmd
}

func netInfo(cmd *cobra.Command, g *globalFlags, id string) (*dsec.NetworkInfo, error) {
	c, err := g.client()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	return c.Sandbox(id).Network(cmd.Context())
}

// The SDK's network structs as the API's messages, for -o json.

func networkResultProto(r dsec.NetworkResult) *sandboxv1.NetworkResult {
	out := &sandboxv1.NetworkResult{Id: r.ID, Policy: r.Policy.Proto()}
	if r.Err != nil {
		out.Error = &sandboxv1.ItemError{Code: codeName(r.Err), Message: r.Err.Message}
	}
	return out
}

func networkDenialProto(d dsec.NetworkDenial) *sandboxv1.NetworkDenial {
	return &sandboxv1.NetworkDenial{Time: timestamppb.New(d.Time), Destination: d.Destination, Name: d.Name, Reason: d.Reason}
}

func networkInfoProto(i *dsec.NetworkInfo) *sandboxv1.GetNetworkResponse {
	out := &sandboxv1.GetNetworkResponse{
		Policy: i.Policy.Proto(), Address: i.Address, Gateway: i.Gateway,
		BytesOut: i.BytesOut, BytesIn: i.BytesIn, ConnectionsOut: i.ConnectionsOut, ConnectionsActive: i.ConnectionsActive,
		Denied: i.Denied, DnsQueries: i.DNSQueries, DnsDenied: i.DNSDenied,
	}
	for _, d := range i.Denials {
		out.Denials = append(out.Denials, networkDenialProto(d))
	}
	return out
}

// codeName is the API's code name of an error's kind ("not_found").
func codeName(e *dsec.Error) string {
	if e.Kind == nil || errors.Is(e, dsec.ErrInternal) {
		return "internal"
	}
	return strings.ReplaceAll(e.Kind.Error(), " ", "_")
}
