package adversarial

import (
	"bytes"
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// TestCrossProjectSandbox takes another project's key (Intruder) to a
// sandbox it knows the ID of, and checks every sandbox call is NotFound,
// as if the sandbox did not exist (its existence is not leaked), list and
// watch show nothing of it, and afterwards the sandbox still runs, with
// its labels, files and commands untouched. Protection: the apiserver
// authorises every sandbox call against the key's project (a sandbox ID
// alone is no capability).
func TestCrossProjectSandbox(t *testing.T) {
	Env(t)
	t.Parallel()
	victim := NewSandbox(t, dsec.CreateOptions{Labels: map[string]string{"owner": "victim"}})
	ctx := Ctx(t, time.Minute)
	MustSh(t, victim, "echo private > /tmp/private")
	execID, err := victim.ExecDetached(ctx, dsec.ExecRequest{Shell: "sleep 60", Timeout: time.Minute, StdinOpen: true})
	if err != nil {
		t.Fatal(err)
	}
	intruder := Intruder(t)
	sb := intruder.Sandbox(victim.ID)
	calls := []struct {
		name string
		call func() error
	}{
		{"Get", func() error { _, err := intruder.Get(ctx, victim.ID); return err }},
		{"Delete", func() error { return intruder.Delete(ctx, victim.ID) }},
		{"Exec", func() error { _, err := sb.Shell(ctx, "echo owned > /tmp/owned"); return err }},
		{"ExecDetached", func() error {
			_, err := sb.ExecDetached(ctx, dsec.ExecRequest{Shell: "echo owned > /tmp/owned"})
			return err
		}},
		{"Start", func() error { _, err := sb.Start(ctx, dsec.ExecRequest{Shell: "true"}); return err }},
		{"Attach", func() error { _, err := sb.Attach(ctx, execID, 0, 0, io.Discard, io.Discard); return err }},
		{"Signal", func() error { return sb.Signal(ctx, execID, 9) }},
		{"WriteStdin", func() error { return sb.WriteStdin(ctx, execID, []byte("x"), true) }},
		{"ResizeTTY", func() error { return sb.ResizeTTY(ctx, execID, 10, 10) }},
		{"ListExecs", func() error { _, err := sb.ListExecs(ctx); return err }},
		{"Stats", func() error { _, err := sb.Stats(ctx); return err }},
		{"SetTimeout", func() error { return sb.SetTimeout(ctx, time.Second, time.Second) }},
		{"UpdateLabels", func() error { return sb.UpdateLabels(ctx, map[string]string{"owner": "intruder"}) }},
		{"ReadFile", func() error { _, err := sb.ReadFile(ctx, "/tmp/private"); return err }},
		{"Download", func() error { _, err := sb.Download(ctx, "/tmp/private", io.Discard); return err }},
		{"WriteFile", func() error { return sb.WriteFile(ctx, "/tmp/owned", []byte("owned")) }},
		{"Stat", func() error { _, err := sb.Stat(ctx, "/tmp/private"); return err }},
		{"ListDir", func() error { _, _, err := sb.ListDir(ctx, "/tmp"); return err }},
		{"MakeDir", func() error { return sb.MakeDir(ctx, "/tmp/owned") }},
		{"Remove", func() error { return sb.Remove(ctx, "/tmp/private", false) }},
		{"Rename", func() error { return sb.Rename(ctx, "/tmp/private", "/tmp/owned", true) }},
		{"UploadTar", func() error {
			_, err := sb.UploadTar(ctx, "/tmp", bytes.NewReader(tarOf(t, tarFile("owned", "owned"))))
			return err
		}},
		{"DownloadTar", func() error { return sb.DownloadTar(ctx, "/tmp", io.Discard) }},
	}
	for _, c := range calls {
		if err := c.call(); !errors.Is(err, dsec.ErrNotFound) {
			t.Errorf("%s of another project's sandbox = %v, want %v", c.name, err, dsec.ErrNotFound)
		}
	}
	if l, err := intruder.List(ctx, nil); err != nil || len(l) != 0 {
		t.Errorf("List with another project's key = %d sandboxes, %v; want 0", len(l), err)
	}
	if ids, err := intruder.DeleteSelector(ctx, map[string]string{"owner": "victim"}); err != nil || len(ids) != 0 {
		t.Errorf("DeleteSelector(owner=victim) with another project's key = %q, %v; want nothing deleted", ids, err)
	}
	// Watch from the start: the victim's events never arrive.
	wctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	var seen []string
	err = intruder.Watch(wctx, dsec.WatchOptions{Initial: true}, func(e dsec.Event) error {
		if e.Sandbox != nil {
			seen = append(seen, e.Type+" "+e.Sandbox.ID)
		}
		return nil
	})
	if err != nil || len(seen) != 0 {
		t.Errorf("Watch with another project's key = %q, %v; want no events", seen, err)
	}
	// The victim is untouched.
	got, err := victim.Stats(ctx)
	if err != nil {
		t.Fatalf("Stats of the victim = %v", err)
	}
	if err := victim.Refresh(ctx); err != nil || victim.State != dsec.StateRunning || victim.Labels["owner"] != "victim" {
		t.Errorf("victim after the intruder = %s, labels %v, %v; want running with owner=victim", victim.State, victim.Labels, err)
	}
	if r := Sh(t, victim, "cat /tmp/private; ls /tmp/owned 2>&1"); !strings.HasPrefix(r.Stdout, "private\n") || !strings.Contains(r.Stdout, "No such file") {
		t.Errorf("victim's files after the intruder = %q; want /tmp/private and no /tmp/owned", r.Stdout)
	}
	execs, err := victim.ListExecs(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, x := range execs {
		if x.ID == execID && !x.Running {
			t.Errorf("the victim's exec %s ended after the intruder's Signal: %+v", execID, x.Exit)
		}
	}
	if got.Pids < 2 {
		t.Errorf("victim pids = %d, want its sleeper still there", got.Pids)
	}
}

// TestCrossProjectCLI does the same through the CLI with another
// project's key: exec, cp, rm and stats of the victim fail and say the
// sandbox was not found. Protection: as TestCrossProjectSandbox; the CLI
// adds no path of its own around the API.
func TestCrossProjectCLI(t *testing.T) {
	p := Env(t)
	t.Parallel()
	victim := NewSandbox(t, dsec.CreateOptions{})
	MustSh(t, victim, "echo private > /tmp/private")
	key := p.ProjectKey(t, IntruderProject+"-cli")
	dst := t.TempDir() + "/stolen"
	for _, args := range [][]string{
		{"exec", victim.ID, "--", "sh", "-c", "echo owned > /tmp/owned"},
		{"cp", victim.ID + ":/tmp/private", dst},
		{"stats", victim.ID},
		{"rm", victim.ID},
	} {
		out, errOut, code := p.CLI(t, "", append([]string{args[0], "--api-key", key}, args[1:]...)...)
		if code == 0 || !strings.Contains(strings.ToLower(errOut), "not found") {
			t.Errorf("dsec %s with another project's key = %q, %q, exit %d; want a not-found failure", args[0], out, errOut, code)
		}
	}
	if r := Sh(t, victim, "cat /tmp/private; ls /tmp/owned 2>/dev/null"); r.Stdout != "private\n" {
		t.Errorf("victim after the CLI intruder = %q, want only /tmp/private", r.Stdout)
	}
}
