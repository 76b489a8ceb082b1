package doctor

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// WriteText writes the report as a table, one line per check
// ("✓ name  detail", "!" for a warning, "✗" for a failure), then what to do
// for each failure and warning, then a summary line.
func (r Report) WriteText(w io.Writer) error {
	width := 0
	for _, c := range r.Checks {
		width = max(width, len(c.Name))
	}
	var b strings.Builder
	var fixes []Outcome
	counts := map[Status]int{}
	failedRequired := 0
	for _, c := range r.Checks {
		counts[c.Status]++
		if c.Status == Fail && c.Required {
			failedRequired++
		}
		detail := oneLine(c.Detail)
		if c.Status == Fail && !c.Required {
			detail += " (optional)"
		}
		fmt.Fprintf(&b, "%s %-*s  %s\n", c.Status.Symbol(), width, c.Name, detail)
		if c.Status != OK && c.Fix != "" {
			fixes = append(fixes, c)
		}
	}
	if len(fixes) > 0 {
		b.WriteString("\nTo fix:\n")
		// Failures first, in check order, then warnings.
		for _, s := range []Status{Fail, Warn} {
			for _, c := range fixes {
				if c.Status == s {
					fmt.Fprintf(&b, "  %s %s: %s\n", c.Status.Symbol(), c.Name, oneLine(c.Fix))
				}
			}
		}
	}
	fmt.Fprintf(&b, "\n%d checks: %d ok, %d %s, %d failed", len(r.Checks),
		counts[OK], counts[Warn], plural(counts[Warn], "warning", "warnings"), counts[Fail])
	if failedRequired > 0 {
		fmt.Fprintf(&b, "; dsec cannot run on this node until the %d required %s fixed\n",
			failedRequired, plural(failedRequired, "failure is", "failures are"))
	} else {
		b.WriteString("; dsec can run on this node\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteJSON writes the report as one indented JSON object:
// {"ok": bool, "checks": [{"name", "required", "status", "detail", "fix"}]}.
func (r Report) WriteJSON(w io.Writer) error {
	if r.Checks == nil {
		r.Checks = []Outcome{}
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(r)
}

func oneLine(s string) string {
	return strings.Join(strings.Fields(strings.ReplaceAll(strings.TrimSpace(s), "\n", "; ")), " ")
}

func plural(n int, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
