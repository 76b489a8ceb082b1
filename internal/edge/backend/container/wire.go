package container

import (
	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// The keeper API has types of its own (keeper/api.go), so that the wire
// does not change when the sandbox contract does; these convert between
// the two. A field added to the contract reaches the keeper only once it
// is added to the keeper's message here, under a new protocol number.

func toKeeperLayers(ls []sandbox.Layer) []keeper.Layer {
	out := make([]keeper.Layer, len(ls))
	for i, l := range ls {
		out[i] = keeper.Layer{Digest: l.Digest, Path: l.Path}
		if z := l.Lazy; z != nil {
			out[i].Lazy = &keeper.LazyLayer{Meta: z.Meta, Data: z.Data, DataSize: z.DataSize, ChunkSize: z.ChunkSize, ChunkDigests: z.ChunkDigests}
		}
	}
	return out
}

func toKeeperResources(r sandbox.Resources) keeper.Resources {
	return keeper.Resources{MemoryBytes: r.MemoryBytes, CPUs: r.CPUs, Pids: r.Pids, DiskBytes: r.DiskBytes}
}

func toKeeperExec(s sandbox.ExecSpec) keeper.ExecSpec {
	k := keeper.ExecSpec{
		ID: s.ID, Argv: s.Argv, Env: s.Env, Cwd: s.Cwd, UID: s.UID, GID: s.GID, Groups: s.Groups,
		Stdin: s.Stdin, StdinOpen: s.StdinOpen, TTY: s.TTY, Rows: s.Rows, Cols: s.Cols,
		Timeout: s.Timeout, OutputLimit: s.OutputLimit, Seal: int(s.Seal),
	}
	k.Session, k.SessionShell = s.Session, s.SessionShell
	k.StepKey = s.StepKey
	return k
}

func fromKeeperExit(e keeper.ExitStatus) sandbox.ExitStatus {
	return sandbox.ExitStatus{
		Code: e.Code, Signal: e.Signal, TimedOut: e.TimedOut, OOMKilled: e.OOMKilled,
		StdoutTruncated: e.StdoutTruncated, StderrTruncated: e.StderrTruncated,
		Lost: e.Lost, Sealed: e.Sealed, Started: e.Started, Ended: e.Ended,
		SessionLost: e.SessionLost, SessionRestarted: e.SessionRestarted,
	}
}

func fromKeeperExecs(in []keeper.ExecInfo) []sandbox.ExecInfo {
	out := make([]sandbox.ExecInfo, len(in))
	for i, e := range in {
		out[i] = sandbox.ExecInfo{
			ID: e.ID, Argv: e.Argv, TTY: e.TTY, Started: e.Started, Running: e.Running,
			StdoutBytes: e.StdoutBytes, StderrBytes: e.StderrBytes, Sealed: e.Sealed,
		}
		out[i].Session = e.Session
		out[i].StepKey = e.StepKey
		if e.Exit != nil {
			st := fromKeeperExit(*e.Exit)
			out[i].Exit = &st
		}
	}
	return out
}

func fromKeeperEvents(in []keeper.Event) []sandbox.Event {
	out := make([]sandbox.Event, len(in))
	for i, e := range in {
		out[i] = sandbox.Event{Sandbox: e.Sandbox, Type: sandbox.EventType(e.Type), Reason: e.Reason, Time: e.Time}
	}
	return out
}

func fromKeeperState(s keeper.State) sandbox.State { return sandbox.State(s) }

func toKeeperStream(s sandbox.Stream) keeper.Stream {
	switch s {
	case sandbox.Stdout:
		return keeper.Stdout
	case sandbox.Stderr:
		return keeper.Stderr
	}
	return keeper.Stream(s)
}
