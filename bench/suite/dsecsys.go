//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/dsecproject/dsec/bench/internal/harness"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// dsecSystem drives the benchmark's own `dsec up` through the Go SDK.
type dsecSystem struct {
	up     *harness.Dsec
	image  string
	memory int64
	keeper int // the keeper's pid
}

func (s *dsecSystem) opts(labels map[string]string) dsec.CreateOptions {
	return dsec.CreateOptions{Image: s.image, Memory: s.memory, Labels: labels}
}

// createFirstExec times Create and the first Exec of true, then deletes
// the sandbox (not timed).
func (s *dsecSystem) createFirstExec(ctx context.Context) (time.Duration, error) {
	t0 := time.Now()
	sb, err := s.up.Client.Create(ctx, s.opts(map[string]string{"bench": "first-exec"}))
	if err != nil {
		return 0, fmt.Errorf("dsec create: %w", err)
	}
	err = execTrue(ctx, sb)
	d := time.Since(t0)
	if derr := sb.Delete(ctx); err == nil && derr != nil {
		err = fmt.Errorf("dsec delete: %w", derr)
	}
	return d, err
}

// execTrue runs true in sb and checks that it exited 0.
func execTrue(ctx context.Context, sb *dsec.Sandbox) error {
	r, err := sb.Exec(ctx, []string{"true"})
	if err != nil {
		return fmt.Errorf("dsec exec in %s: %w", sb.ID, err)
	}
	if r.Code() != 0 {
		return fmt.Errorf("dsec exec in %s: true ended with %d: %s", sb.ID, r.Code(), r.Stderr)
	}
	return nil
}

func (s *dsecSystem) roots() []int { return []int{s.up.UpPid(), s.keeper} }

// dsecCreator makes running sandboxes with one Create per sandbox; each
// round labels its sandboxes so that cleanup deletes them with one call.
type dsecCreator struct {
	s     *dsecSystem
	label string
	n     int
}

func (c *dsecCreator) system() string { return "dsec" }
func (c *dsecCreator) name() string   { return "dsec Create" }
func (c *dsecCreator) roots() []int   { return c.s.roots() }

func (c *dsecCreator) prepare(ctx context.Context, count int) error {
	c.n++
	c.label = fmt.Sprintf("burst-%d", c.n)
	return nil
}

func (c *dsecCreator) create(ctx context.Context, i int) error {
	if _, err := c.s.up.Client.Create(ctx, c.s.opts(map[string]string{"bench": c.label})); err != nil {
		return fmt.Errorf("dsec create: %w", err)
	}
	return nil
}

func (c *dsecCreator) cleanup(ctx context.Context) error {
	if _, err := c.s.up.Client.DeleteSelector(ctx, map[string]string{"bench": c.label}); err != nil {
		return fmt.Errorf("dsec delete -l bench=%s: %w", c.label, err)
	}
	return nil
}

// batch creates count sandboxes with BatchCreate, dsec.MaxBatch per call,
// the calls conc at a time.
func (c *dsecCreator) batch(ctx context.Context, count, conc int) error {
	calls := (count + dsec.MaxBatch - 1) / dsec.MaxBatch
	return harness.ForEach(ctx, calls, conc, func(ctx context.Context, i int) error {
		n := min(dsec.MaxBatch, count-i*dsec.MaxBatch)
		res, err := c.s.up.Client.BatchCreate(ctx, c.s.opts(map[string]string{"bench": c.label}), n)
		if err != nil {
			return fmt.Errorf("dsec batch create: %w", err)
		}
		var errs []error
		for _, r := range res {
			if r.Err != nil {
				errs = append(errs, fmt.Errorf("item %d: %w", r.Index, r.Err))
			}
		}
		if len(errs) > 0 {
			return fmt.Errorf("dsec batch create: %d of %d items failed: %w", len(errs), n, errors.Join(errs[:min(3, len(errs))]...))
		}
		return nil
	})
}
