package fusion

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"path"
	"sort"
	"strings"
	"unicode/utf8"
)

// The wire format of SandboxFusion's run_code (sandbox/server/sandbox_api.py
// and sandbox/runners/types.py in bytedance/SandboxFusion): field names,
// defaults and the meaning of each status are theirs.

// RunCodeRequest is the body of POST /run_code.
type RunCodeRequest struct {
	// Code is the program; required.
	Code string `json:"code"`
	// Language names the runner; required (python, bash, go, …).
	Language string `json:"language"`
	// CompileTimeout and RunTimeout are in seconds (default 10 each).
	CompileTimeout float64 `json:"compile_timeout"`
	RunTimeout     float64 `json:"run_timeout"`
	// MemoryLimitMB is the memory limit in MiB; -1 (the default) or 0
	// take the server's.
	MemoryLimitMB int `json:"memory_limit_MB"`
	// Stdin, when set, is the program's standard input.
	Stdin *string `json:"stdin"`
	// Files maps paths relative to the working directory to base64
	// contents; null contents are skipped, as are names containing
	// IGNORE_THIS_FILE.
	Files map[string]*string `json:"files"`
	// FetchFiles are paths relative to the working directory to return
	// after the run (those that are not regular files are left out).
	FetchFiles []string `json:"fetch_files"`
	// Args are extra arguments of SandboxFusion's pytest runner; accepted
	// and unused.
	Args []string `json:"args"`
}

// RunStatus is the outcome of a whole call.
type RunStatus string

const (
	// StatusSuccess: every command finished with return code 0.
	StatusSuccess RunStatus = "Success"
	// StatusFailed: a command returned non-zero or ran out of time.
	StatusFailed RunStatus = "Failed"
	// StatusSandboxError: the platform could not run the code (unknown
	// language, bad file paths, a platform failure); Message says why.
	StatusSandboxError RunStatus = "SandboxError"
)

// CommandStatus is how one command (compile or run) ended.
type CommandStatus string

const (
	CommandFinished          CommandStatus = "Finished"
	CommandError             CommandStatus = "Error"
	CommandTimeLimitExceeded CommandStatus = "TimeLimitExceeded"
)

// CommandRunResult is one command's outcome.
type CommandRunResult struct {
	Status CommandStatus `json:"status"`
	// ExecutionTime is in seconds.
	ExecutionTime *float64 `json:"execution_time"`
	// ReturnCode is the exit code, or -N when signal N ended the command;
	// null when it ran out of time or did not run.
	ReturnCode *int    `json:"return_code"`
	Stdout     *string `json:"stdout"`
	Stderr     *string `json:"stderr"`
	// StdoutTruncated and StderrTruncated (dsec's, absent when false): the
	// stream passed the output cap and the rest of it was dropped.
	StdoutTruncated bool `json:"stdout_truncated,omitempty"`
	StderrTruncated bool `json:"stderr_truncated,omitempty"`
}

// RunCodeResponse is the answer to POST /run_code.
type RunCodeResponse struct {
	Status  RunStatus `json:"status"`
	Message string    `json:"message"`
	// CompileResult is set for compiled languages; RunResult unless the
	// compile failed.
	CompileResult   *CommandRunResult `json:"compile_result"`
	RunResult       *CommandRunResult `json:"run_result"`
	ExecutorPodName *string           `json:"executor_pod_name"`
	// Files maps each fetched path to its base64 contents.
	Files map[string]string `json:"files"`
}

// Defaults of SandboxFusion's RunCodeRequest.
const (
	DefaultCompileTimeout = 10.0
	DefaultRunTimeout     = 10.0
)

// RequestError is a request that does not parse (HTTP 422, like
// SandboxFusion's validation errors). Err is the cause, when reading the
// body failed.
type RequestError struct {
	Msg string
	Err error
}

func (e *RequestError) Error() string { return e.Msg }
func (e *RequestError) Unwrap() error { return e.Err }

// ParseRequest decodes a run_code body. Missing timeouts take
// SandboxFusion's defaults. Errors are *RequestError.
func ParseRequest(r io.Reader) (*RunCodeRequest, error) {
	// Decode into raw fields first, to tell a missing field from a zero.
	var raw map[string]json.RawMessage
	dec := json.NewDecoder(r)
	if err := dec.Decode(&raw); err != nil {
		return nil, &RequestError{Msg: "the body is not a JSON object: " + err.Error(), Err: err}
	}
	if dec.More() {
		return nil, &RequestError{Msg: "the body has data after the JSON object"}
	}
	req := &RunCodeRequest{CompileTimeout: DefaultCompileTimeout, RunTimeout: DefaultRunTimeout, MemoryLimitMB: -1}
	for _, f := range []string{"code", "language"} {
		if v, ok := raw[f]; !ok || isNull(v) {
			return nil, &RequestError{Msg: fmt.Sprintf("field %q is required", f)}
		}
	}
	fields := []struct {
		name string
		dst  any
	}{
		{"code", &req.Code}, {"language", &req.Language},
		{"compile_timeout", &req.CompileTimeout}, {"run_timeout", &req.RunTimeout},
		{"memory_limit_MB", &req.MemoryLimitMB}, {"stdin", &req.Stdin},
		{"files", &req.Files}, {"fetch_files", &req.FetchFiles}, {"args", &req.Args},
	}
	for _, f := range fields {
		v, ok := raw[f.name]
		if !ok || isNull(v) {
			continue
		}
		if err := json.Unmarshal(v, f.dst); err != nil {
			return nil, &RequestError{Msg: fmt.Sprintf("field %q: %v", f.name, typeError(err))}
		}
	}
	for _, t := range []struct {
		name string
		v    float64
	}{{"compile_timeout", req.CompileTimeout}, {"run_timeout", req.RunTimeout}} {
		if math.IsNaN(t.v) || math.IsInf(t.v, 0) {
			return nil, &RequestError{Msg: fmt.Sprintf("field %q must be a number of seconds", t.name)}
		}
	}
	return req, nil
}

func isNull(v json.RawMessage) bool { return bytes.Equal(bytes.TrimSpace(v), []byte("null")) }

func typeError(err error) string {
	var te *json.UnmarshalTypeError
	if errors.As(err, &te) {
		return fmt.Sprintf("got a JSON %s, want %s", te.Value, te.Type)
	}
	return err.Error()
}

// File is an input file, its path cleaned and relative to the working
// directory.
type File struct {
	Path string
	Data []byte
}

// MaxPathLength is the longest path of a file in or out.
const MaxPathLength = 4096

// CleanPath checks that p names a file inside the working directory and
// returns it relative to it, cleaned. Absolute paths, paths that climb out
// with "..", the working directory itself, and names with NUL bytes or
// invalid UTF-8 are refused.
func CleanPath(p string) (string, error) {
	switch {
	case p == "":
		return "", errors.New("empty file path")
	case len(p) > MaxPathLength:
		return "", fmt.Errorf("file path longer than %d bytes", MaxPathLength)
	case strings.IndexByte(p, 0) >= 0:
		return "", fmt.Errorf("file path %.80q contains a NUL byte", p)
	case !utf8.ValidString(p):
		return "", fmt.Errorf("file path %.80q is not valid UTF-8", p)
	case strings.HasPrefix(p, "/"):
		return "", fmt.Errorf("file path %.80q is absolute: give paths relative to the working directory", p)
	}
	c := path.Clean(p)
	if c == "." || c == ".." || strings.HasPrefix(c, "../") {
		return "", fmt.Errorf("file path %.80q is outside the working directory", p)
	}
	return c, nil
}

// InputFiles validates and decodes a request's files, in path order.
// Entries with null contents or IGNORE_THIS_FILE in their name are skipped,
// as SandboxFusion does. Two names that clean to the same path, or a path
// that is also a directory of another, are refused.
func InputFiles(files map[string]*string) ([]File, error) {
	names := make([]string, 0, len(files))
	for name := range files {
		names = append(names, name)
	}
	sort.Strings(names)
	var out []File
	seen := make(map[string]bool, len(names))
	for _, name := range names {
		content := files[name]
		if content == nil || strings.Contains(name, "IGNORE_THIS_FILE") {
			continue
		}
		p, err := CleanPath(name)
		if err != nil {
			return nil, err
		}
		if seen[p] {
			return nil, fmt.Errorf("files %.80q: another entry names the same path", name)
		}
		seen[p] = true
		data, err := base64.StdEncoding.DecodeString(*content)
		if err != nil {
			return nil, fmt.Errorf("files %.80q: the content is not base64: %v", name, err)
		}
		out = append(out, File{Path: p, Data: data})
	}
	for _, f := range out {
		for d := path.Dir(f.Path); d != "."; d = path.Dir(d) {
			if seen[d] {
				return nil, fmt.Errorf("files %.80q: %.80q is both a file and a directory", f.Path, d)
			}
		}
	}
	return out, nil
}

// FetchPaths validates the paths of fetch_files and returns them cleaned,
// in the request's order.
func FetchPaths(paths []string) ([]string, error) {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		c, err := CleanPath(p)
		if err != nil {
			return nil, fmt.Errorf("fetch_files: %w", err)
		}
		out = append(out, c)
	}
	return out, nil
}

// Outcome computes a call's status and message from its results, as
// SandboxFusion's parse_run_status does: a command that could not run
// makes a SandboxError (its stderr is the message); otherwise a timeout or
// a non-zero return code makes Failed; else Success.
func Outcome(compile, run *CommandRunResult) (RunStatus, string) {
	var results []*CommandRunResult
	for _, r := range []*CommandRunResult{compile, run} {
		if r != nil {
			results = append(results, r)
		}
	}
	for _, r := range results {
		if r.Status == CommandError {
			msg := ""
			if r.Stderr != nil {
				msg = *r.Stderr
			}
			return StatusSandboxError, msg
		}
	}
	for _, r := range results {
		if r.Status == CommandTimeLimitExceeded {
			return StatusFailed, ""
		}
	}
	for _, r := range results {
		if r.ReturnCode != nil && *r.ReturnCode != 0 {
			return StatusFailed, ""
		}
	}
	return StatusSuccess, ""
}
