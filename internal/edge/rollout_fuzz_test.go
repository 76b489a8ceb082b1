package edge

import (
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protojson"

	rolloutv1 "github.com/dsecproject/dsec/api/dsec/rollout/v1"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// FuzzRolloutSpec: any JSON a client sends as a rollout's spec either
// fails to parse, is refused with InvalidArgument, or is a spec whose
// bounds hold (1-16 members, unique names, one worker at most, no reserved
// label).
func FuzzRolloutSpec(f *testing.F) {
	f.Add(`{"labels":{"job":"j1"},"ttl":"3600s","members":[{"name":"worker","role":"worker","sandbox":{"image":"python"}},{"name":"agent","sandbox":{"image":"busybox","labels":{"a":"b"}}}]}`)
	f.Add(`{"members":[{"name":"a","sandbox":{"labels":{"dsec.rollout":"x-r-aaaaaaaaaaaa"}}}]}`)
	f.Add(`{"idleAction":"pause","members":[]}`)
	f.Fuzz(func(t *testing.T, in string) {
		var s rolloutv1.Spec
		if protojson.Unmarshal([]byte(in), &s) != nil {
			return
		}
		if err := ValidateRolloutSpec(&s); err != nil {
			if !isInvalid(err) {
				t.Fatalf("ValidateRolloutSpec(%s) = %v, want InvalidArgument", in, err)
			}
			return
		}
		n, workers := len(s.GetMembers()), 0
		names := map[string]bool{}
		if n < 1 || n > MaxRolloutMembers {
			t.Fatalf("accepted %d members", n)
		}
		if _, ok := s.GetLabels()[RolloutLabel]; ok {
			t.Fatalf("accepted the reserved label: %s", in)
		}
		for _, m := range s.GetMembers() {
			if names[m.GetName()] || !memberNameRe.MatchString(m.GetName()) || m.GetSandbox() == nil {
				t.Fatalf("accepted member %v", m)
			}
			names[m.GetName()] = true
			if m.GetRole() == roleWorker {
				workers++
			}
			if _, ok := m.GetSandbox().GetLabels()[RolloutLabel]; ok {
				t.Fatalf("accepted the reserved label on member %s", m.GetName())
			}
		}
		if workers > 1 {
			t.Fatalf("accepted %d workers", workers)
		}
	})
}

// FuzzRolloutStatus: a status CheckStatus accepts stays within its
// bounds, whatever the sets and removals.
func FuzzRolloutStatus(f *testing.F) {
	f.Add("step/1", "done", "", 3)
	f.Add("a b", "x", "step/1", 1)
	f.Add("k", strings.Repeat("v", 5000), "", 1)
	f.Fuzz(func(t *testing.T, key, value, remove string, copies int) {
		cur := map[string]string{}
		copies = max(0, min(copies, 100))
		var next map[string]string
		var err error
		for i := range copies {
			set := map[string]string{key + strings.Repeat("x", i%3): value}
			next, err = CheckStatus(cur, set, []string{remove})
			if err != nil {
				if !isInvalid(err) {
					t.Fatalf("CheckStatus = %v, want InvalidArgument", err)
				}
				return
			}
			cur = next
		}
		size := 0
		for k, v := range cur {
			if !statusKeyRe.MatchString(k) || len(v) > MaxStatusValue {
				t.Fatalf("accepted %q=%d bytes", k, len(v))
			}
			size += len(k) + len(v)
		}
		if len(cur) > MaxStatusKeys || size > MaxStatusBytes {
			t.Fatalf("accepted a status of %d keys, %d bytes", len(cur), size)
		}
	})
}

func isInvalid(err error) bool { return errdefs.Is(err, errdefs.ErrInvalidArgument) }
