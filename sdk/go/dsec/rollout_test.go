package dsec

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"
)

func TestParseRolloutSpec(t *testing.T) {
	s, err := ParseRolloutSpec([]byte(`{"labels":{"job":"j"},"ttl":"7200s","idleAction":"pause",
		"members":[{"name":"worker","role":"worker","sandbox":{"image":"py","resources":{"memoryBytes":"268435456"},"network":{"text":"allow=dsec-api"}}},
		{"name":"agent","sandbox":{"image":"busybox","env":{"A":"1"}}}]}`))
	if err != nil {
		t.Fatal(err)
	}
	if s.TTL != 2*time.Hour || s.IdleAction != "pause" || len(s.Members) != 2 || s.Members[0].Role != RoleWorker ||
		s.Members[0].Sandbox.Memory != 256<<20 || s.Members[0].Sandbox.Network.Text != "allow=dsec-api" || s.Members[1].Sandbox.Env["A"] != "1" {
		t.Errorf("ParseRolloutSpec = %+v", s)
	}
	for _, bad := range []string{`{"tll":"1s"}`, `{"members":[{"nam":"a"}]}`, `[]`, `{"ttl":"forever"}`} {
		if _, err := ParseRolloutSpec([]byte(bad)); !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("ParseRolloutSpec(%s) = %v, want ErrInvalidArgument", bad, err)
		}
	}
	if _, err := (RolloutSpec{}).proto(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a spec without members = %v, want ErrInvalidArgument", err)
	}
	if _, err := (RolloutSpec{Members: []RolloutMember{{Name: "a", Sandbox: CreateOptions{Image: "x", TTL: time.Hour}}}}).proto(); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("a member with its own TTL = %v, want ErrInvalidArgument", err)
	}
}

// FuzzParseRolloutSpec: any bytes either fail to parse with
// ErrInvalidArgument or give a spec that goes back on the wire as it was
// read, for the fields a rollout takes.
func FuzzParseRolloutSpec(f *testing.F) {
	f.Add([]byte(`{"labels":{"job":"j"},"ttl":"60s","members":[{"name":"a","role":"worker","sandbox":{"image":"busybox"}}]}`))
	f.Add([]byte(`{"members":[{"name":"a","sandbox":{"layers":["sha256:aa"],"layerConfig":{"env":["A=1"]}}}]}`))
	f.Add([]byte(`{"members":[]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := ParseRolloutSpec(data)
		if err != nil {
			if !errors.Is(err, ErrInvalidArgument) {
				t.Fatalf("ParseRolloutSpec = %v, want ErrInvalidArgument", err)
			}
			return
		}
		p, err := s.proto()
		if err != nil {
			return // no members, or a member without an image: refused before a call
		}
		back := rolloutSpecOf(p)
		p2, err := back.proto()
		if err != nil || !proto.Equal(p, p2) {
			t.Fatalf("the spec does not go back on the wire as read: %v, %v", p, p2)
		}
	})
}
