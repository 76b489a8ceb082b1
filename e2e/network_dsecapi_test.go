package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestSandboxAPI is dsec-api from inside real sandboxes: one whose policy
// allows it finds the platform at api.dsec.internal and calls it (plain
// Connect JSON with busybox wget) as itself, whatever key it sends: its
// own project's sandboxes, no admin, none of the calls that would take it
// around its policy (a network policy change, a sandbox with a network, a
// key), no pause. A sandbox whose policy does not allow it resolves nothing and
// reaches nothing at its gateway, and revoking dsec-api cuts it off.
func TestSandboxAPI(t *testing.T) {
	p := newPlatform(t)
	p.Busybox(t)
	c := p.Client(t, p.AdminKey(t))
	ctx := ctxT(t)
	create := func(network string) *dsec.Sandbox {
		t.Helper()
		sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Memory: 64 << 20, Network: dsec.NetworkFlag(network)})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sb.Delete(ctx) })
		return sb
	}
	api, other := create("allow=dsec-api"), create("allow=pypi")
	// The test image has no resolv.conf, and its nc takes addresses: the
	// name is asked of the gateway, the calls go to the address it gives.
	apiInfo, err := api.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	gw := apiInfo.Gateway
	sh := func(sb *dsec.Sandbox, cmd string) (string, int) {
		t.Helper()
		r, err := sb.Shell(ctx, cmd, dsec.WithTimeout(30*time.Second))
		if err != nil {
			t.Fatalf("%s: %s: %v", sb.ID, cmd, err)
		}
		return string(r.Stdout) + string(r.Stderr), r.Code()
	}
	// request sends one HTTP/1.1 request from inside sb to port 80 of
	// addr, with a forged admin key, and returns the response (empty when
	// the connection was refused). Its input stays open a while: a client
	// that half-closes has its call cancelled, as any Go server does.
	request := func(sb *dsec.Sandbox, addr, method, path, body string) string {
		t.Helper()
		out, _ := sh(sb, fmt.Sprintf(`B='%s'; (printf "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: application/json\r\n`+
			`Authorization: Bearer %sx\r\nContent-Length: ${#B}\r\nConnection: close\r\n\r\n%%s" "$B"; sleep 1) | nc -w 5 %s 80`,
			body, method, path, netpolicy.APIName, p.AdminKey(t), addr))
		return out
	}
	call := func(procedure, body string) string {
		t.Helper()
		return request(api, gw, "POST", "/"+procedure, body)
	}

	if out, code := sh(api, "nslookup "+netpolicy.APIName+" "+gw); code != 0 || !strings.Contains(out, "Address: "+gw) {
		t.Errorf("nslookup %s in a sandbox allowed dsec-api = exit %d, %s; want its gateway %s", netpolicy.APIName, code, out, gw)
	}
	if out := request(api, gw, "GET", "/healthz", ""); !strings.HasPrefix(out, "HTTP/1.1 200") {
		t.Fatalf("healthz from a sandbox allowed dsec-api = %q; want 200", out)
	}
	if out := call("dsec.admin.v1.AdminService/WhoAmI", "{}"); !strings.HasPrefix(out, "HTTP/1.1 200") ||
		!strings.Contains(out, `"name":"sandbox `+api.ID+`"`) || strings.Contains(out, `"admin":true`) {
		t.Errorf("WhoAmI from the sandbox = %s; want the sandbox's own key, not an admin's (the forged key ignored)", out)
	}
	if out := call("dsec.sandbox.v1.SandboxService/List", "{}"); !strings.HasPrefix(out, "HTTP/1.1 200") || !strings.Contains(out, api.ID) || !strings.Contains(out, other.ID) {
		t.Errorf("List from the sandbox = %s; want its project's sandboxes", out)
	}
	for _, refused := range []struct{ procedure, body string }{
		{"dsec.sandbox.v1.SandboxService/UpdateNetwork", `{"id":"` + api.ID + `","policy":{"mode":"open"}}`},
		{"dsec.sandbox.v1.SandboxService/UpdateNetwork", `{"id":"` + other.ID + `","policy":{"mode":"open"}}`},
		{"dsec.sandbox.v1.SandboxService/Create", `{"image":"busybox","network":{"mode":"open"}}`},
		{"dsec.admin.v1.AdminService/CreateKey", `{"name":"mine"}`},
		{"dsec.image.v1.ImageService/DeleteImage", `{"name":"busybox"}`},
		// No pause, of itself or of its project's others (sandboxapi.go
		// says why); resume is what any request does.
		{"dsec.sandbox.v1.SandboxService/Pause", `{"id":"` + api.ID + `"}`},
		{"dsec.sandbox.v1.SandboxService/Pause", `{"id":"` + other.ID + `"}`},
		{"dsec.sandbox.v1.SandboxService/Pause", `{"selector":{"a":"b"}}`},
	} {
		if out := call(refused.procedure, refused.body); !strings.HasPrefix(out, "HTTP/1.1 403") {
			t.Errorf("%s %s from the sandbox = %s; want 403 (permission denied)", refused.procedure, refused.body, out)
		}
	}
	info, err := other.Network(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.Policy == nil || info.Policy.Mode == "open" {
		t.Errorf("%s's policy is %+v after the refused update", other.ID, info.Policy)
	}

	// Without dsec-api: no name, nothing at the gateway's port 80.
	if out, _ := sh(other, "nslookup "+netpolicy.APIName+" "+info.Gateway); strings.Contains(out, "Address: "+info.Gateway) {
		t.Errorf("a sandbox without dsec-api resolved %s: %s", netpolicy.APIName, out)
	}
	t0 := time.Now()
	if out := request(other, info.Gateway, "GET", "/healthz", ""); out != "" || time.Since(t0) > 4*time.Second {
		t.Errorf("a sandbox without dsec-api at its gateway's port 80 = %q after %v; want refused at once", out, time.Since(t0))
	}

	// Revoked: cut off.
	if _, err := api.UpdateNetwork(ctx, dsec.NetworkFlag("allow=pypi"), false); err != nil {
		t.Fatal(err)
	}
	if out := request(api, gw, "GET", "/healthz", ""); out != "" {
		t.Errorf("healthz after dsec-api was revoked = %q, want no answer", out)
	}
}
