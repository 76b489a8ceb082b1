package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// PackRequest asks for a sandbox's writable layer as a new layer.
type PackRequest struct {
	Sandbox string `json:"sandbox"`
	// Scrub lists absolute paths left out of the layer.
	Scrub []string `json:"scrub,omitempty"`
}

// Headers of a pack reply, whose body is the layer's EROFS image.
const (
	headerPackDigest = "Dsec-Layer-Digest"
	headerPackFiles  = "Dsec-Layer-Files"
	headerPackFrozen = "Dsec-Frozen-Ns"
)

// Pack is a layer the keeper packed, being read from its reply.
type Pack struct {
	// Digest is "sha256:<hex>" of the image, Size its length.
	Digest string
	Size   int64
	// Files counts the names in the layer.
	Files int
	// Frozen is how long the sandbox was frozen.
	Frozen time.Duration
	// Body is the image; the caller reads it to its end and closes it.
	Body io.ReadCloser
}

// PackDiff asks the keeper to freeze the sandbox, build a layer of its
// writable layer and thaw it; the layer streams back in Pack.Body. A pack
// of a sandbox that is being packed already is Aborted.
func (c *Client) PackDiff(ctx context.Context, req PackRequest) (*Pack, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return nil, err
	}
	hr, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://keeper/v1/sandbox/pack", bytes.NewReader(b))
	if err != nil {
		return nil, err
	}
	hr.Header.Set(headerProtocol, strconv.Itoa(Protocol))
	resp, err := c.http.Do(hr)
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, errdefs.Newf(errdefs.ErrUnavailable, "node keeper at %s does not answer (%v): restart `dsec up`", c.Socket(), err)
	}
	if resp.StatusCode >= 300 {
		defer resp.Body.Close()
		var w wireError
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&w); err != nil {
			return nil, fmt.Errorf("keeper pack: HTTP %d", resp.StatusCode)
		}
		return nil, w.decode()
	}
	p := &Pack{Digest: resp.Header.Get(headerPackDigest), Size: resp.ContentLength, Body: resp.Body}
	p.Files, _ = strconv.Atoi(resp.Header.Get(headerPackFiles))
	ns, _ := strconv.ParseInt(resp.Header.Get(headerPackFrozen), 10, 64)
	p.Frozen = time.Duration(ns)
	if p.Digest == "" || p.Size < 0 {
		resp.Body.Close()
		return nil, fmt.Errorf("keeper pack: reply without a digest or length")
	}
	return p, nil
}
