package keeper

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/dsecproject/dsec/internal/chunkcache"
	"github.com/dsecproject/dsec/internal/errdefs"
)

// Client talks to the keeper of a state directory.
type Client struct {
	Layout
	http *http.Client
}

// NewClient returns a client for the keeper of stateDir. It does not
// connect until the first call.
func NewClient(stateDir string) *Client {
	l := Layout{StateDir: stateDir}
	sock := l.Socket()
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", sock)
		},
		MaxIdleConns:        256,
		MaxIdleConnsPerHost: 256,
		IdleConnTimeout:     90 * time.Second,
	}
	return &Client{Layout: l, http: &http.Client{Transport: tr}}
}

// Close drops idle connections.
func (c *Client) Close() { c.http.CloseIdleConnections() }

// Version asks the keeper who it is; it fails fast when none runs.
func (c *Client) Version(ctx context.Context) (Version, error) {
	var v Version
	err := c.call(ctx, http.MethodGet, "/v1/version", nil, nil, &v)
	return v, err
}

// Create starts a sandbox.
func (c *Client) Create(ctx context.Context, req CreateRequest) (SandboxInfo, error) {
	var info SandboxInfo
	err := c.call(ctx, http.MethodPost, "/v1/sandbox/create", nil, req, &info)
	return info, err
}

// Delete stops a sandbox and removes everything it used.
func (c *Client) Delete(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodPost, "/v1/sandbox/delete", url.Values{"id": {id}}, nil, nil)
}

// Status reports one sandbox.
func (c *Client) Status(ctx context.Context, id string) (SandboxInfo, error) {
	var info SandboxInfo
	err := c.call(ctx, http.MethodGet, "/v1/sandbox/status", url.Values{"id": {id}}, nil, &info)
	return info, err
}

// List reports every sandbox the keeper has.
func (c *Client) List(ctx context.Context) ([]SandboxInfo, error) {
	var out []SandboxInfo
	err := c.call(ctx, http.MethodGet, "/v1/sandbox/list", nil, nil, &out)
	return out, err
}

// Stats reports a sandbox's resource use.
func (c *Client) Stats(ctx context.Context, id string) (Stats, error) {
	var st Stats
	err := c.call(ctx, http.MethodGet, "/v1/sandbox/stats", url.Values{"id": {id}}, nil, &st)
	return st, err
}

// Pause stops a sandbox's processes and starts moving its memory out of
// RAM (protocol 6); with wait it replies once the memory has moved.
// Pausing a paused sandbox changes nothing and reports it.
func (c *Client) Pause(ctx context.Context, id string, wait bool) (PauseInfo, error) {
	var info PauseInfo
	err := c.call(ctx, http.MethodPost, "/v1/sandbox/pause", pauseQuery(id, wait), nil, &info)
	return info, err
}

// Resume lets a paused sandbox's processes run again and reads back the
// memory that was resident when it was paused (protocol 6); with wait it
// replies once the reads are under way for all of it. Resuming a running
// sandbox changes nothing and reports it.
func (c *Client) Resume(ctx context.Context, id string, wait bool) (PauseInfo, error) {
	var info PauseInfo
	err := c.call(ctx, http.MethodPost, "/v1/sandbox/resume", pauseQuery(id, wait), nil, &info)
	return info, err
}

// PauseState reports a sandbox's pause state and where its memory is,
// changing nothing (protocol 6).
func (c *Client) PauseState(ctx context.Context, id string) (PauseInfo, error) {
	var info PauseInfo
	err := c.call(ctx, http.MethodGet, "/v1/sandbox/pause", url.Values{"id": {id}}, nil, &info)
	return info, err
}

func pauseQuery(id string, wait bool) url.Values {
	q := url.Values{"id": {id}}
	if wait {
		q.Set("wait", "1")
	}
	return q
}

// StartExec starts a command in a sandbox.
func (c *Client) StartExec(ctx context.Context, req ExecRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/exec/start", nil, req, nil)
}

// WaitExec waits for a command to end.
func (c *Client) WaitExec(ctx context.Context, id, execID string) (ExitStatus, error) {
	for {
		var rec ExitRecord
		// Long polls end after a while so that dead connections are noticed.
		err := c.call(ctx, http.MethodGet, "/v1/exec/wait", url.Values{"sandbox": {id}, "exec": {execID}, "timeout": {"30s"}}, nil, &rec)
		if errors.Is(err, errPollAgain) {
			continue
		}
		return rec.ExitStatus, err
	}
}

// WriteStdin writes to an exec's stdin and optionally closes it.
func (c *Client) WriteStdin(ctx context.Context, req StdinRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/exec/stdin", nil, req, nil)
}

// Signal signals an exec's process group.
func (c *Client) Signal(ctx context.Context, req SignalRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/exec/signal", nil, req, nil)
}

// Resize resizes a TTY exec.
func (c *Client) Resize(ctx context.Context, req ResizeRequest) error {
	return c.call(ctx, http.MethodPost, "/v1/exec/resize", nil, req, nil)
}

// ListExecs returns a sandbox's command journal.
func (c *Client) ListExecs(ctx context.Context, id string) ([]ExecInfo, error) {
	var out []ExecInfo
	err := c.call(ctx, http.MethodGet, "/v1/exec/list", url.Values{"sandbox": {id}}, nil, &out)
	return out, err
}

// ListSessions lists a sandbox's shell sessions (protocol 4).
func (c *Client) ListSessions(ctx context.Context, id string) ([]SessionInfo, error) {
	var r sessionsReply
	err := c.call(ctx, http.MethodGet, "/v1/sessions", url.Values{"sandbox": {id}}, nil, &r)
	return r.Sessions, err
}

// DeleteSession kills a session's shell and every process it started
// (protocol 4).
func (c *Client) DeleteSession(ctx context.Context, id, name string) error {
	return c.call(ctx, http.MethodDelete, "/v1/sessions", url.Values{"sandbox": {id}, "name": {name}}, nil, nil)
}

// SetNetwork gives sandbox id a network under req's policy, or replaces
// its policy (protocol 5).
func (c *Client) SetNetwork(ctx context.Context, id string, req NetworkRequest) (NetworkInfo, error) {
	var info NetworkInfo
	err := c.call(ctx, http.MethodPut, "/v1/network", url.Values{"sandbox": {id}}, req, &info)
	return info, err
}

// Network reports sandbox id's network: policy, addresses, counters and
// recent denials (protocol 5).
func (c *Client) Network(ctx context.Context, id string) (NetworkInfo, error) {
	var info NetworkInfo
	err := c.call(ctx, http.MethodGet, "/v1/network", url.Values{"sandbox": {id}}, nil, &info)
	return info, err
}

// NodeNetwork reports the node's network totals and what it holds
// (protocol 5).
func (c *Client) NodeNetwork(ctx context.Context) (NodeNetwork, error) {
	var nn NodeNetwork
	err := c.call(ctx, http.MethodGet, "/v1/network/node", nil, nil, &nn)
	return nn, err
}

// DeleteNetwork removes sandbox id's link: it keeps loopback only
// (protocol 5).
func (c *Client) DeleteNetwork(ctx context.Context, id string) error {
	return c.call(ctx, http.MethodDelete, "/v1/network", url.Values{"sandbox": {id}}, nil, nil)
}

// ChunkCacheStats reports the keeper's chunk cache of lazy layers;
// NotFound when it has none (no --blob-source).
func (c *Client) ChunkCacheStats(ctx context.Context) (chunkcache.Stats, error) {
	var st chunkcache.Stats
	err := c.call(ctx, http.MethodGet, "/v1/chunkcache/stats", nil, nil, &st)
	return st, err
}

// Events waits up to about 30 s for events after cursor.
func (c *Client) Events(ctx context.Context, cursor string) ([]Event, string, error) {
	var r EventsReply
	err := c.call(ctx, http.MethodGet, "/v1/events", url.Values{"cursor": {cursor}, "timeout": {"25s"}}, nil, &r)
	return r.Events, r.Cursor, err
}

// ApplySettings changes the keeper's live settings (protocol 3) and
// returns those it runs with now; FailedPrecondition when s differs in a
// setting that does not change live.
func (c *Client) ApplySettings(ctx context.Context, s Settings) (Settings, error) {
	var got Settings
	err := c.call(ctx, http.MethodPost, "/v1/settings", nil, s, &got)
	return got, err
}

// Shutdown asks the keeper to exit. With kill, it first deletes every
// sandbox; without, sandboxes keep running (unowned) until a new keeper
// adopts them.
func (c *Client) Shutdown(ctx context.Context, kill bool) error {
	q := url.Values{}
	if kill {
		q.Set("kill", "1")
	}
	return c.call(ctx, http.MethodPost, "/v1/shutdown", q, nil, nil)
}

var errPollAgain = errors.New("poll again")

func (c *Client) call(ctx context.Context, method, path string, q url.Values, in, out any) error {
	var body io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return err
		}
		body = bytes.NewReader(b)
	}
	u := "http://keeper" + path
	if len(q) > 0 {
		u += "?" + q.Encode()
	}
	req, err := http.NewRequestWithContext(ctx, method, u, body)
	if err != nil {
		return err
	}
	req.Header.Set(headerProtocol, strconv.Itoa(Protocol))
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return errdefs.Newf(errdefs.ErrUnavailable, "node keeper at %s does not answer (%v): restart `dsec up`", c.Socket(), err)
	}
	defer resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusAccepted:
		return errPollAgain
	case resp.StatusCode >= 300:
		var w wireError
		if err := json.NewDecoder(io.LimitReader(resp.Body, 1<<20)).Decode(&w); err != nil {
			return fmt.Errorf("keeper %s: HTTP %d", path, resp.StatusCode)
		}
		return w.decode()
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("keeper %s: decode reply: %w", path, err)
	}
	return nil
}
