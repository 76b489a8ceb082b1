package doctor

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

func TestStatusText(t *testing.T) {
	for _, tc := range []struct {
		s            Status
		text, symbol string
	}{
		{OK, "ok", "✓"},
		{Warn, "warn", "!"},
		{Fail, "fail", "✗"},
	} {
		b, err := tc.s.MarshalText()
		if err != nil || string(b) != tc.text {
			t.Errorf("%v.MarshalText() = %q, %v, want %q", tc.s, b, err, tc.text)
		}
		if got := tc.s.Symbol(); got != tc.symbol {
			t.Errorf("%v.Symbol() = %q, want %q", tc.s, got, tc.symbol)
		}
		var back Status
		if err := back.UnmarshalText(b); err != nil || back != tc.s {
			t.Errorf("UnmarshalText(%q) = %v, %v, want %v", b, back, err, tc.s)
		}
	}
	var s Status
	if err := s.UnmarshalText([]byte("fine")); err == nil {
		t.Errorf("UnmarshalText(%q) succeeded, want an error", "fine")
	}
}

func TestWriteText(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    Report
		want string
	}{
		{
			name: "all ok",
			r: Report{OK: true, Checks: []Outcome{
				{Name: "root", Required: true, Result: Result{Status: OK, Detail: "running as root"}},
				{Name: "erofs mount", Required: true, Result: Result{Status: OK, Detail: "mounted"}},
			}},
			want: `✓ root         running as root
✓ erofs mount  mounted

2 checks: 2 ok, 0 warnings, 0 failed; dsec can run on this node
`,
		},
		{
			name: "warnings and failures",
			r: Report{OK: false, Checks: []Outcome{
				{Name: "open files", Result: Result{Status: Warn, Detail: "hard limit 20000", Fix: "ulimit -n 1048576"}},
				{Name: "root", Required: true, Result: Result{Status: OK, Detail: "running as root"}},
				{Name: "state dir", Required: true, Result: Result{Status: Fail, Detail: "/srv (0700) cannot be\ntraversed", Fix: "chmod o+x /srv"}},
				{Name: "mkfs.xfs", Result: Result{Status: Fail, Detail: "not found", Fix: "apt-get install xfsprogs"}},
				{Name: "kernel", Result: Result{Status: Warn, Detail: "cannot read"}},
			}},
			want: `! open files  hard limit 20000
✓ root        running as root
✗ state dir   /srv (0700) cannot be; traversed
✗ mkfs.xfs    not found (optional)
! kernel      cannot read

To fix:
  ✗ state dir: chmod o+x /srv
  ✗ mkfs.xfs: apt-get install xfsprogs
  ! open files: ulimit -n 1048576

5 checks: 1 ok, 2 warnings, 2 failed; dsec cannot run on this node until the 1 required failure is fixed
`,
		},
		{
			name: "one warning",
			r: Report{OK: true, Checks: []Outcome{
				{Name: "swap", Result: Result{Status: Warn, Detail: "none", Fix: "add swap"}},
			}},
			want: `! swap  none

To fix:
  ! swap: add swap

1 checks: 0 ok, 1 warning, 0 failed; dsec can run on this node
`,
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var b bytes.Buffer
			if err := tc.r.WriteText(&b); err != nil {
				t.Fatalf("WriteText: %v", err)
			}
			if diff := cmp.Diff(tc.want, b.String()); diff != "" {
				t.Errorf("WriteText() mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestWriteJSON(t *testing.T) {
	r := Report{OK: false, Checks: []Outcome{
		{Name: "root", Required: true, Result: Result{Status: OK, Detail: "running as root"}},
		{Name: "state dir", Required: true, Result: Result{Status: Fail, Detail: "/srv <0700>", Fix: "chmod o+x /srv"}},
	}}
	var b bytes.Buffer
	if err := r.WriteJSON(&b); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	want := `{
  "ok": false,
  "checks": [
    {
      "name": "root",
      "required": true,
      "status": "ok",
      "detail": "running as root"
    },
    {
      "name": "state dir",
      "required": true,
      "status": "fail",
      "detail": "/srv <0700>",
      "fix": "chmod o+x /srv"
    }
  ]
}
`
	if diff := cmp.Diff(want, b.String()); diff != "" {
		t.Errorf("WriteJSON() mismatch (-want +got):\n%s", diff)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatalf("decode WriteJSON output: %v", err)
	}
	if diff := cmp.Diff(r, back); diff != "" {
		t.Errorf("WriteJSON round trip mismatch (-want +got):\n%s", diff)
	}

	b.Reset()
	if err := (Report{OK: true}).WriteJSON(&b); err != nil {
		t.Fatal(err)
	}
	if got, want := strings.Join(strings.Fields(b.String()), ""), `{"ok":true,"checks":[]}`; got != want {
		t.Errorf("WriteJSON(empty) = %s, want %s", got, want)
	}
}

func TestRunChecks(t *testing.T) {
	result := func(r Result) func(context.Context, Env) Result {
		return func(context.Context, Env) Result { return r }
	}
	failed := Result{Status: Fail, Detail: "broken", Fix: "mend it"}
	for _, tc := range []struct {
		name   string
		checks []Check
		wantOK bool
		want   []Status
	}{
		{"required fail", []Check{{"a", true, result(failed)}, {"b", false, result(Result{Status: OK})}}, false, []Status{Fail, OK}},
		{"optional fail", []Check{{"a", false, result(failed)}, {"b", true, result(Result{Status: Warn})}}, true, []Status{Fail, Warn}},
		{"panic", []Check{{"a", true, func(context.Context, Env) Result { panic("boom") }}}, false, []Status{Fail}},
		{"none", nil, true, nil},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := RunChecks(t.Context(), Env{}, tc.checks)
			if r.OK != tc.wantOK {
				t.Errorf("RunChecks().OK = %v, want %v", r.OK, tc.wantOK)
			}
			var got []Status
			for i, o := range r.Checks {
				got = append(got, o.Status)
				if o.Name != tc.checks[i].Name || o.Required != tc.checks[i].Required {
					t.Errorf("outcome %d = %q required %v, want %q required %v", i, o.Name, o.Required, tc.checks[i].Name, tc.checks[i].Required)
				}
				if o.Status == Fail && o.Fix == "" {
					t.Errorf("outcome %q = %+v, want a fix", o.Name, o.Result)
				}
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("RunChecks() statuses mismatch (-want +got):\n%s", diff)
			}
		})
	}
}

func TestRunChecksDefaultsAndCancel(t *testing.T) {
	var seen Env
	capture := Check{"env", true, func(_ context.Context, env Env) Result { seen = env; return Result{Status: OK} }}
	RunChecks(t.Context(), Env{}, []Check{capture})
	if seen.StateDir != "/var/lib/dsec" || seen.Listen != "127.0.0.1:7420" || seen.IDMap.HostID != 1_000_000_000 || seen.IDMap.Size != 65536 || seen.Binary == "" {
		t.Errorf("RunChecks(Env{}) passed %+v, want the defaults", seen)
	}

	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	ran := false
	r := RunChecks(ctx, Env{}, []Check{{"x", true, func(context.Context, Env) Result { ran = true; return Result{} }}})
	if ran || r.OK || r.Checks[0].Status != Fail {
		t.Errorf("RunChecks(canceled) ran=%v report %+v, want not run and failed", ran, r)
	}
}
