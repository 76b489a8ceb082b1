package blobsource

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// HTTPOptions configures NewHTTP. The zero value works.
type HTTPOptions struct {
	// Client sends the requests; nil means a client of its own with
	// keep-alive connections.
	Client *http.Client
	// Token, when set, is sent as "Authorization: Bearer <Token>".
	Token string
	// Timeout bounds each request, from sending it to reading the last
	// byte of its body; 0 means 30 s. The caller's context still applies.
	Timeout time.Duration
}

// HTTP reads blobs from an HTTP server with Range requests.
type HTTP struct {
	base    string // without a trailing slash
	oci     bool
	client  *http.Client
	token   string
	timeout time.Duration
}

var _ Source = (*HTTP)(nil)

// NewHTTP returns a Source reading blobs over HTTP. A blob is
// GET <baseURL>/blobs/sha256/<hex> (dsec blobserver, or a bucket holding
// a blob store's layout under a "blobs/" prefix); when baseURL's path
// contains "/v2/" (an OCI registry's repository, .../v2/<repo>) it is
// GET <baseURL>/blobs/sha256:<hex>, as the distribution spec names it.
func NewHTTP(baseURL string, opts HTTPOptions) (Source, error) {
	u, err := url.Parse(baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument,
			"blob source %q: want an http:// or https:// URL", baseURL)
	}
	h := &HTTP{
		base:    strings.TrimSuffix(baseURL, "/"),
		oci:     strings.Contains(u.Path+"/", "/v2/"),
		client:  opts.Client,
		token:   opts.Token,
		timeout: opts.Timeout,
	}
	if h.client == nil {
		t := http.DefaultTransport.(*http.Transport).Clone()
		t.MaxIdleConnsPerHost = 64
		h.client = &http.Client{Transport: t}
	}
	if h.timeout <= 0 {
		h.timeout = 30 * time.Second
	}
	return h, nil
}

func (h *HTTP) url(digest string) (string, error) {
	hx, err := checkDigest(digest)
	if err != nil {
		return "", err
	}
	if h.oci {
		return h.base + "/blobs/sha256:" + hx, nil
	}
	return h.base + "/blobs/sha256/" + hx, nil
}

func (h *HTTP) request(ctx context.Context, method, digest string) (*http.Request, error) {
	u, err := h.url(digest)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, u, nil)
	if err != nil {
		return nil, fmt.Errorf("blob %s: %w", digest, err)
	}
	if h.token != "" {
		req.Header.Set("Authorization", "Bearer "+h.token)
	}
	return req, nil
}

// statusError maps a response's status to an error kind.
func statusError(digest string, resp *http.Response) error {
	var kind error
	switch {
	case resp.StatusCode == http.StatusNotFound:
		kind = errdefs.ErrNotFound
	case resp.StatusCode == http.StatusUnauthorized:
		kind = errdefs.ErrUnauthenticated
	case resp.StatusCode == http.StatusForbidden:
		kind = errdefs.ErrPermissionDenied
	case resp.StatusCode == http.StatusTooManyRequests, resp.StatusCode >= 500:
		kind = errdefs.ErrUnavailable
	default:
		kind = errdefs.ErrInternal
	}
	return fmt.Errorf("blob %s: %s answered %s: %w", digest, resp.Request.URL.Host, resp.Status, kind)
}

func transportError(digest string, err error) error {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("blob %s: %w", digest, err)
	}
	return fmt.Errorf("blob %s: %w: %w", digest, errdefs.ErrUnavailable, err)
}

// ReadAt implements Source.
func (h *HTTP) ReadAt(ctx context.Context, digest string, p []byte, off int64) (int, error) {
	if off < 0 {
		return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "blob %s: negative offset %d", digest, off)
	}
	if len(p) == 0 {
		return 0, nil
	}
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := h.request(ctx, http.MethodGet, digest)
	if err != nil {
		return 0, err
	}
	end := off + int64(len(p)) - 1
	req.Header.Set("Range", fmt.Sprintf("bytes=%d-%d", off, end))
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, transportError(digest, err)
	}
	defer resp.Body.Close()

	var body io.Reader = resp.Body
	want := len(p)
	switch resp.StatusCode {
	case http.StatusPartialContent:
		first, last, _, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err != nil || first != off || last > end || last < first {
			return 0, fmt.Errorf("blob %s: asked for bytes %d-%d, got Content-Range %.100q: %w",
				digest, off, end, resp.Header.Get("Content-Range"), errdefs.ErrUnavailable)
		}
		want = int(last - first + 1)
	case http.StatusOK: // the server ignored Range: skip to off
		if _, err := io.CopyN(io.Discard, body, off); err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			return 0, transportError(digest, err)
		}
	case http.StatusRequestedRangeNotSatisfiable:
		return 0, io.EOF
	default:
		return 0, statusError(digest, resp)
	}
	n, err := io.ReadFull(body, p[:want])
	switch {
	case (errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF)) && resp.StatusCode == http.StatusOK:
		return n, io.EOF // the whole blob was shorter
	case errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, io.EOF):
		return n, fmt.Errorf("blob %s: response ended after %d of %d bytes: %w", digest, n, want, errdefs.ErrUnavailable)
	case err != nil:
		return n, transportError(digest, err)
	}
	if n < len(p) {
		return n, io.EOF
	}
	return n, nil
}

// Size implements Source. It sends HEAD and, when the server gives no
// length (or refuses HEAD), GET of the first byte and reads the length
// from Content-Range.
func (h *HTTP) Size(ctx context.Context, digest string) (int64, error) {
	ctx, cancel := context.WithTimeout(ctx, h.timeout)
	defer cancel()
	req, err := h.request(ctx, http.MethodHead, digest)
	if err != nil {
		return 0, err
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return 0, transportError(digest, err)
	}
	resp.Body.Close()
	switch {
	case resp.StatusCode == http.StatusOK && resp.ContentLength >= 0:
		return resp.ContentLength, nil
	case resp.StatusCode != http.StatusOK && resp.StatusCode != http.StatusMethodNotAllowed:
		return 0, statusError(digest, resp)
	}

	req, err = h.request(ctx, http.MethodGet, digest)
	if err != nil {
		return 0, err
	}
	req.Header.Set("Range", "bytes=0-0")
	resp, err = h.client.Do(req)
	if err != nil {
		return 0, transportError(digest, err)
	}
	defer resp.Body.Close()
	switch resp.StatusCode {
	case http.StatusPartialContent:
		_, _, size, err := parseContentRange(resp.Header.Get("Content-Range"))
		if err != nil || size < 0 {
			return 0, fmt.Errorf("blob %s: no size in Content-Range %.100q: %w",
				digest, resp.Header.Get("Content-Range"), errdefs.ErrUnavailable)
		}
		return size, nil
	case http.StatusOK:
		if resp.ContentLength >= 0 {
			return resp.ContentLength, nil
		}
		n, err := io.Copy(io.Discard, resp.Body)
		if err != nil {
			return 0, transportError(digest, err)
		}
		return n, nil
	case http.StatusRequestedRangeNotSatisfiable:
		return 0, nil // an empty blob
	}
	return 0, statusError(digest, resp)
}

// parseContentRange parses "bytes <first>-<last>/<size>" where size may
// be "*" (returned as -1).
func parseContentRange(s string) (first, last, size int64, err error) {
	bad := fmt.Errorf("bad Content-Range %.100q", s)
	rest, ok := strings.CutPrefix(s, "bytes ")
	if !ok {
		return 0, 0, 0, bad
	}
	rng, total, ok := strings.Cut(rest, "/")
	if !ok {
		return 0, 0, 0, bad
	}
	a, b, ok := strings.Cut(rng, "-")
	if !ok {
		return 0, 0, 0, bad
	}
	if first, err = parseUint(a); err != nil {
		return 0, 0, 0, bad
	}
	if last, err = parseUint(b); err != nil || last < first {
		return 0, 0, 0, bad
	}
	if total == "*" {
		return first, last, -1, nil
	}
	if size, err = parseUint(total); err != nil || last >= size {
		return 0, 0, 0, bad
	}
	return first, last, size, nil
}

func parseUint(s string) (int64, error) {
	if s == "" || s[0] == '+' || s[0] == '-' {
		return 0, strconv.ErrSyntax
	}
	return strconv.ParseInt(s, 10, 64)
}
