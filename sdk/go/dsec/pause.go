package dsec

import (
	"context"
	"time"

	"connectrpc.com/connect"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
)

// Idle actions (CreateOptions.IdleAction, Timeouts.IdleAction,
// Sandbox.IdleAction): what a sandbox's idle TTL does when it runs out.
const (
	// IdleDelete deletes the sandbox (the default).
	IdleDelete = "delete"
	// IdlePause pauses it; the next request resumes it.
	IdlePause = "pause"
)

// PauseResult is the outcome of a pause or resume of one sandbox.
type PauseResult struct {
	ID string
	// State is the sandbox's state after it: StatePaused after a pause,
	// StateRunning after a resume.
	State string
	// Resident is the sandbox's memory in RAM and Swapped its memory out of
	// RAM (in the node's swap) when the call returned, in bytes.
	Resident, Swapped int64
	// Took is how long the pause or resume took; zero when the sandbox was
	// already so.
	Took time.Duration
	// Err is why it failed for this sandbox (by selector only: by ID the
	// call fails).
	Err *Error
}

// Pause stops the sandbox's processes and has its node push its memory out
// of RAM (to swap, where the node has it); its files, processes and state
// stay. Paused time counts against neither its hard nor its idle TTL; its
// paused TTL (CreateOptions.PausedTTL, default 24h) deletes it if it stays
// paused longer. Any later exec, file operation, attach, session command
// or port connection resumes it first. Pausing a paused sandbox reports it
// as it is. s.State is updated.
func (s *Sandbox) Pause(ctx context.Context) (*PauseResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.c.sandboxes.Pause(ctx, connect.NewRequest(&sandboxv1.PauseRequest{Id: s.ID}))
	if err != nil {
		return nil, s.c.err(err)
	}
	return s.pauseResult("pause", resp.Msg.GetResults())
}

// Resume makes a paused sandbox run again; resuming a running sandbox
// reports it as it is. A node that cannot hold the sandbox's memory again
// refuses with ErrResourceExhausted and a retry hint (Error.RetryAfter),
// and the sandbox stays paused. s.State is updated.
func (s *Sandbox) Resume(ctx context.Context) (*PauseResult, error) {
	if err := s.check(); err != nil {
		return nil, err
	}
	resp, err := s.c.sandboxes.Resume(ctx, connect.NewRequest(&sandboxv1.ResumeRequest{Id: s.ID}))
	if err != nil {
		return nil, s.c.err(err)
	}
	return s.pauseResult("resume", resp.Msg.GetResults())
}

func (s *Sandbox) pauseResult(what string, rs []*sandboxv1.PauseResult) (*PauseResult, error) {
	for _, r := range rs {
		if r.GetId() != s.ID {
			continue
		}
		res := pauseResultOf(r)
		if res.Err != nil {
			return nil, res.Err
		}
		s.State = res.State
		return &res, nil
	}
	return nil, newError(ErrInternal, "%s: the server did not answer for sandbox %s", what, s.ID)
}

// Pause pauses every sandbox the selector matches (labels ANDed, at least
// one: a job), as Sandbox.Pause does, and returns one result per sandbox,
// in ID order; what fails for one sandbox is in its result.
func (c *Client) Pause(ctx context.Context, selector map[string]string) ([]PauseResult, error) {
	if len(selector) == 0 {
		return nil, newError(ErrInvalidArgument, "pause: the selector needs at least one label (example: job=run-42), or pause a sandbox by ID")
	}
	resp, err := c.sandboxes.Pause(ctx, connect.NewRequest(&sandboxv1.PauseRequest{Selector: selector}))
	if err != nil {
		return nil, c.err(err)
	}
	return pauseResultsOf(resp.Msg.GetResults()), nil
}

// Resume resumes every sandbox the selector matches, as Sandbox.Resume
// does, and returns one result per sandbox, in ID order.
func (c *Client) Resume(ctx context.Context, selector map[string]string) ([]PauseResult, error) {
	if len(selector) == 0 {
		return nil, newError(ErrInvalidArgument, "resume: the selector needs at least one label (example: job=run-42), or resume a sandbox by ID")
	}
	resp, err := c.sandboxes.Resume(ctx, connect.NewRequest(&sandboxv1.ResumeRequest{Selector: selector}))
	if err != nil {
		return nil, c.err(err)
	}
	return pauseResultsOf(resp.Msg.GetResults()), nil
}

func pauseResultsOf(rs []*sandboxv1.PauseResult) []PauseResult {
	out := make([]PauseResult, 0, len(rs))
	for _, r := range rs {
		out = append(out, pauseResultOf(r))
	}
	return out
}

func pauseResultOf(r *sandboxv1.PauseResult) PauseResult {
	res := PauseResult{ID: r.GetId(), Resident: r.GetResidentBytes(), Swapped: r.GetSwappedBytes()}
	if r.GetError() != nil {
		res.Err = itemError(r.GetError())
		return res
	}
	res.State = stateName(r.GetState())
	if r.GetTook() != nil {
		res.Took = r.GetTook().AsDuration()
	}
	return res
}
