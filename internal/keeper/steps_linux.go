package keeper

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// Exec step keys (protocol 6). A step key is the caller's name for one
// step of its work (a rollout worker's "step-3"); the journal records it
// with the exec, and a second exec with the step key of an earlier exec of
// the sandbox is refused, so that a client that lost track of a step finds
// it (ListExecs) instead of running it twice.
//
// Uniqueness lives on disk, beside the journal: sandboxes/ID/steps holds
// one file per step key, named by the key's SHA-256 and created with
// O_EXCL, holding the key and the exec it names. Claims are made with the
// sandbox's op lock held (every exec start takes it), so two starts of one
// key cannot both pass. A claim whose exec has no journal entry (its start
// failed, or a keeper died between the claim and the entry) names nothing
// and is taken over. A keeper restart keeps them: they are files.

// MaxStepKey is the longest step key, in bytes.
const MaxStepKey = 256

// stepClaim is a steps/ file.
type stepClaim struct {
	StepKey string `json:"step_key"`
	Exec    string `json:"exec"`
}

// checkStepKey refuses a step key the journal cannot hold.
func checkStepKey(key string) error {
	switch {
	case len(key) > MaxStepKey:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "step key of %d bytes: at most %d", len(key), MaxStepKey)
	case strings.IndexByte(key, 0) >= 0:
		return errdefs.Newf(errdefs.ErrInvalidArgument, "step key %.80q holds a NUL byte", key)
	}
	return nil
}

func (k *Keeper) stepPath(id, key string) string {
	sum := sha256.Sum256([]byte(key))
	return filepath.Join(k.l.SandboxDir(id), "steps", hex.EncodeToString(sum[:]))
}

// claimStep records that exec execID of sandbox id is step key; the
// caller holds the sandbox's op lock. An empty key claims nothing. A key
// an earlier exec holds is AlreadyExists naming that exec. release drops
// the claim (for a start that fails before its journal entry exists).
func (k *Keeper) claimStep(id, key, execID string) (release func(), err error) {
	if key == "" {
		return func() {}, nil
	}
	if err := checkStepKey(key); err != nil {
		return nil, err
	}
	path := k.stepPath(id, key)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return nil, fmt.Errorf("exec steps: %w", err)
	}
	b, err := json.Marshal(stepClaim{StepKey: key, Exec: execID})
	if err != nil {
		return nil, err
	}
	release = func() { os.Remove(path) }
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err == nil {
		_, werr := f.Write(b)
		if cerr := f.Close(); werr == nil {
			werr = cerr
		}
		if werr != nil {
			release()
			return nil, fmt.Errorf("exec steps: %w", werr)
		}
		return release, nil
	}
	if !errors.Is(err, os.ErrExist) {
		return nil, fmt.Errorf("exec steps: %w", err)
	}
	var held stepClaim
	raw, rerr := os.ReadFile(path)
	if rerr == nil && json.Unmarshal(raw, &held) == nil && held.Exec != "" {
		if _, serr := os.Stat(filepath.Join(k.l.ExecDir(id, held.Exec), "spec.json")); serr == nil {
			return nil, errdefs.Newf(errdefs.ErrAlreadyExists,
				"step key %.80q is exec %s's in sandbox %s: find its result with ListExecs (step_keys) or attach to it, instead of running it again", key, held.Exec, id)
		}
	}
	// A claim that names no journal entry: take it over.
	if err := writeJSON(path, stepClaim{StepKey: key, Exec: execID}); err != nil {
		return nil, fmt.Errorf("exec steps: %w", err)
	}
	return release, nil
}
