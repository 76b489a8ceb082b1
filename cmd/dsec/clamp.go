package main

import (
	"fmt"
	"io"
	"strconv"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// noteClamped tells the user on w when the node lowered a CPU cap the
// create asked for (caps above the node's cores are clamped to them,
// CONTRACT.md): the sandbox runs, with less than was asked.
func noteClamped(w io.Writer, asked dsec.CreateOptions, sb *dsec.Sandbox) {
	got := sb.Resources.CPUs
	if asked.CPUs <= 0 || got <= 0 || got >= asked.CPUs {
		return
	}
	unit := "CPUs"
	if got == 1 {
		unit = "CPU"
	}
	fmt.Fprintf(w, "dsec: --cpus %s was lowered to this node's %s %s\n", formatCPUs(asked.CPUs), formatCPUs(got), unit)
}

func formatCPUs(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }
