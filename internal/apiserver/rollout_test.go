package apiserver

import (
	"context"
	"strings"
	"testing"

	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	"github.com/dsecproject/dsec/api/dsec/admin/v1/adminv1connect"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
	"github.com/dsecproject/dsec/api/dsec/rollout/v1/rolloutv1connect"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// TestSandboxGuardRolloutMember: a rollout member's own key may make the
// calls memberAllowed names and none other, of any service (an allow list:
// a call added to the API later is refused until it is named); a plain
// sandbox key keeps what it had.
func TestSandboxGuardRolloutMember(t *testing.T) {
	member := context.WithValue(context.Background(), keyCtx{}, cluster.Key{ID: "sandbox", Project: "p", Sandbox: "n1-aaaaaaaaaaaa", Rollout: "n1-r-bbbbbbbbbbbb"})
	plain := context.WithValue(context.Background(), keyCtx{}, cluster.Key{ID: "sandbox", Project: "p", Sandbox: "n1-aaaaaaaaaaaa"})
	var all []string
	for _, svc := range []string{sandboxv1connect.SandboxServiceName, rolloutv1connect.RolloutServiceName, imagev1connect.ImageServiceName, adminv1connect.AdminServiceName} {
		for _, m := range procedures(svc) {
			all = append(all, "/"+svc+"/"+m)
		}
	}
	if len(all) < 50 {
		t.Fatalf("found %d procedures, want the API's (at least 50)", len(all))
	}
	g := sandboxGuard{}
	allowed := 0
	for _, proc := range all {
		err := g.check(proc)
		if err == nil {
			err = g.checkMember(member, proc)
		}
		switch {
		case memberAllowed[proc] && err != nil:
			t.Errorf("member key: %s = %v, want allowed", proc, err)
		case !memberAllowed[proc] && !errdefs.Is(err, errdefs.ErrPermissionDenied):
			t.Errorf("member key: %s = %v, want PermissionDenied", proc, err)
		case !memberAllowed[proc] && sandboxDenied[proc] == "" && !strings.Contains(err.Error(), "n1-r-bbbbbbbbbbbb"):
			t.Errorf("member key: %s = %v, want the refusal to name the rollout", proc, err)
		}
		if memberAllowed[proc] {
			allowed++
		}
		if _, denied := sandboxDenied[proc]; !denied {
			if err := g.checkMember(plain, proc); err != nil {
				t.Errorf("plain sandbox key: %s = %v, want allowed as before", proc, err)
			}
		}
	}
	if allowed != len(memberAllowed) {
		t.Errorf("memberAllowed names %d calls, %d of them exist", len(memberAllowed), allowed)
	}
	for _, refused := range []string{"Create", "List", "Delete", "UpdateLabels", "BatchCreate", "Watch", "Pause", "Resume", "SetTimeout", "GradeFrom"} {
		if memberAllowed["/"+sandboxv1connect.SandboxServiceName+"/"+refused] {
			t.Errorf("a member's key may call %s", refused)
		}
	}
	for _, refused := range []string{"Create", "List", "Delete"} {
		if memberAllowed["/"+rolloutv1connect.RolloutServiceName+"/"+refused] {
			t.Errorf("a member's key may call rollout %s", refused)
		}
	}
}

// procedures lists the methods of a service of the API, by name.
func procedures(svc string) []string {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil
	}
	ms := d.(protoreflect.ServiceDescriptor).Methods()
	out := make([]string, ms.Len())
	for i := range ms.Len() {
		out[i] = string(ms.Get(i).Name())
	}
	return out
}
