package dsec

import (
	"bytes"
	"context"
	"errors"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Steps: commands that run at most once, whoever asks and however often.
//
// Every exec may carry a step key (ExecRequest.StepKey), the caller's name
// for that step of its work; the sandbox's journal records it, and a second
// exec with the same key is refused (ErrAlreadyExists). RunStep and
// RunSteps build on that: given the steps a job intends, they return the
// journal's result for each step that already ran (matched by step key or
// exec ID), follow a step still running to its end (attaching by exec ID
// from offset 0), and run only the steps that never started. A trainer or
// worker restarted after a preemption calls them again with the same list
// and fast-forwards to where it was, without running any step twice.

// MaxStepKey is the longest step key, in bytes.
const MaxStepKey = 256

// Step is one command of a job, for RunStep and RunSteps.
type Step struct {
	// Key names the step in the sandbox's journal: unique in the sandbox,
	// at most MaxStepKey bytes. A step without a Key is found by ExecID
	// only, and run (without a key) when it has none.
	Key string
	// ExecID, when known, is the exec of an earlier run of this step (the
	// journal is searched for it as well as for Key).
	ExecID string
	// Request is the command; its StepKey is set from Key.
	Request ExecRequest
}

// StepSource says where a step's result came from.
type StepSource int

// The sources of a StepResult.
const (
	// StepRan: the step had never started; it ran now.
	StepRan StepSource = iota
	// StepAttached: the step was running; it was followed to its end.
	StepAttached
	// StepRecorded: the step had ended; its result and output were read
	// from the journal.
	StepRecorded
)

// String returns "ran", "attached" or "recorded".
func (s StepSource) String() string {
	switch s {
	case StepAttached:
		return "attached"
	case StepRecorded:
		return "recorded"
	}
	return "ran"
}

// StepResult is a step's result: how its command ended, its whole output,
// and where the result came from.
type StepResult struct {
	ExecResult
	From StepSource
}

// stepRetries bounds how often a step whose stream broke is followed again.
const stepRetries = 8

// RunStep runs one step at most once in the sandbox: its recorded result
// if it ran, its end if it runs, else it runs now. See RunSteps.
func (s *Sandbox) RunStep(ctx context.Context, step Step) (*StepResult, error) {
	rs, err := s.RunSteps(ctx, []Step{step})
	if len(rs) == 1 {
		return rs[0], err
	}
	return nil, err
}

// RunSteps runs steps in order, each at most once in the sandbox, and
// returns their results (the first len(results) steps when it fails). The
// journal is read once: a step it holds (by Key, or by ExecID) is not run
// again: an ended one's result and output are read back, a running one is
// followed to its end. A step the journal lacks runs with its Key as the
// exec's step key; if another client started it meanwhile (the key is
// taken), that exec is followed instead. A stream that breaks is followed
// again by exec ID, and a start whose fate is unknown (the stream broke
// before the server said it started) is looked up by its key before it is
// tried again. A command that ran and failed is a result, not an error.
func (s *Sandbox) RunSteps(ctx context.Context, steps []Step) ([]*StepResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	byID := false
	var keys []string
	for i, st := range steps {
		if len(st.Key) > MaxStepKey {
			return nil, newError(ErrInvalidArgument, "step %d: a step key of %d bytes: at most %d", i, len(st.Key), MaxStepKey)
		}
		if st.Key == "" && st.ExecID == "" {
			continue
		}
		if st.Key != "" {
			keys = append(keys, st.Key)
		}
		if st.ExecID != "" {
			byID = true
		}
	}
	var journal []ExecInfo
	if len(keys) > 0 || byID {
		var err error
		if byID {
			journal, err = s.ListExecs(ctx)
		} else {
			journal, err = s.ListExecs(ctx, WithStepKeys(keys...))
		}
		if err != nil {
			return nil, err
		}
	}
	find := func(st Step) *ExecInfo {
		for i := range journal {
			e := &journal[i]
			if st.Key != "" && e.StepKey == st.Key || st.ExecID != "" && e.ID == st.ExecID {
				return e
			}
		}
		return nil
	}
	out := make([]*StepResult, 0, len(steps))
	for _, st := range steps {
		var r *StepResult
		var err error
		if e := find(st); e != nil {
			from := StepRecorded
			if e.Running {
				from = StepAttached
			}
			r, err = s.followStep(ctx, e.ID, from)
		} else {
			r, err = s.startStep(ctx, st)
		}
		if err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}

// startStep runs a step the journal did not hold.
func (s *Sandbox) startStep(ctx context.Context, st Step) (*StepResult, error) {
	req := st.Request
	req.StepKey = st.Key
	for attempt := 1; ; attempt++ {
		var stdout, stderr bytes.Buffer
		status, err := s.ExecStream(ctx, req, &stdout, &stderr)
		switch {
		case err == nil:
			return &StepResult{ExecResult: ExecResult{ExitStatus: *status, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, From: StepRan}, nil
		case status != nil && status.ExecID != "":
			// It started; its stream broke. Follow it, never start it again.
			return s.followStep(ctx, status.ExecID, StepRan)
		case errors.Is(err, ErrAlreadyExists) && st.Key != "":
			// Another client ran it, or an earlier try of ours did.
		case errors.Is(err, ErrUnavailable) && st.Key != "" && attempt < stepRetries && ctx.Err() == nil:
			// Unknown whether it started: its key says, below.
			if werr := sleepCtx(ctx, backoff(attempt)); werr != nil {
				return nil, err
			}
		default:
			return nil, err
		}
		journal, lerr := s.ListExecs(ctx, WithStepKeys(st.Key))
		if lerr != nil {
			if errors.Is(lerr, ErrUnavailable) && attempt < stepRetries {
				continue
			}
			return nil, lerr
		}
		if len(journal) > 0 {
			from := StepRecorded
			if journal[0].Running {
				from = StepAttached
			}
			return s.followStep(ctx, journal[0].ID, from)
		}
		if errors.Is(err, ErrAlreadyExists) {
			return nil, err // taken, yet not in the journal: say so
		}
	}
}

// followStep follows exec execID from offset 0 to its end, again when the
// stream breaks.
func (s *Sandbox) followStep(ctx context.Context, execID string, from StepSource) (*StepResult, error) {
	for attempt := 1; ; attempt++ {
		var stdout, stderr bytes.Buffer
		status, err := s.Attach(ctx, execID, 0, 0, &stdout, &stderr)
		if err == nil {
			return &StepResult{ExecResult: ExecResult{ExitStatus: *status, Stdout: stdout.Bytes(), Stderr: stderr.Bytes()}, From: from}, nil
		}
		if !errors.Is(err, ErrUnavailable) || attempt >= stepRetries || ctx.Err() != nil {
			return nil, err
		}
		if werr := sleepCtx(ctx, backoff(attempt)); werr != nil {
			return nil, err
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// ListExecsOption changes what ListExecs returns.
type ListExecsOption func(*sandboxv1.ListExecsRequest)

// WithStepKeys lists only the execs with these step keys.
func WithStepKeys(keys ...string) ListExecsOption {
	return func(r *sandboxv1.ListExecsRequest) { r.StepKeys = append(r.StepKeys, keys...) }
}

// listExecs is ListExecs's call.
func (s *Sandbox) listExecs(ctx context.Context, opts []ListExecsOption) (*connect.Response[sandboxv1.ListExecsResponse], error) {
	req := &sandboxv1.ListExecsRequest{SandboxId: s.ID}
	for _, o := range opts {
		o(req)
	}
	return s.c.sandboxes.ListExecs(ctx, connect.NewRequest(req))
}
