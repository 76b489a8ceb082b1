package dsec

import (
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"

	"github.com/BurntSushi/toml"
)

// Defaults of CONTRACT.md.
const (
	// DefaultAddr is the API address of a local `dsec up`.
	DefaultAddr = "http://127.0.0.1:7420"
	// DefaultStateDir is the server's state directory, which holds the
	// admin key (admin.key) after the first start.
	DefaultStateDir = "/var/lib/dsec"
)

// Config says how to reach and authenticate to a dsec API server. The zero
// value reaches DefaultAddr without a key; LoadConfig fills it the way the
// CLI does.
type Config struct {
	// Addr is the API's URL, http:// or https:// (default DefaultAddr).
	Addr string
	// APIKey is sent as `Authorization: Bearer <key>`. When empty, calls
	// fail with ErrUnauthenticated without reaching the server.
	APIKey string
	// StateDir is where LoadConfig looks for admin.key (default
	// DSEC_STATE_DIR, then DefaultStateDir). New does not use it.
	StateDir string
	// HTTPClient, when set, is used as is (and not closed by Close). By
	// default New makes one that speaks HTTP/2 without TLS (h2c, prior
	// knowledge) to http:// addresses and HTTP/2 or HTTP/1.1 over TLS to
	// https:// ones.
	HTTPClient *http.Client
	// ShortLived says the program makes one or a few calls and exits, as a
	// command-line tool does. The first call to an http:// address then
	// goes over a connection of its own, HTTP/1.1 handled in the calling
	// goroutine, which starts about a millisecond sooner in a new process
	// than the HTTP/2 connection every later call shares. Ignored with
	// HTTPClient.
	ShortLived bool
	// UserAgent is put before this package's own User-Agent.
	UserAgent string
	// CreateRetries is how often Create tries again after a refusal that
	// waiting can help: ResourceExhausted (after the server's RetryAfter
	// hint) and, with an IdempotencyKey, Unavailable (after a backoff).
	// Other kinds, InvalidArgument above all, are never retried. Create
	// does not start a wait that would end after ctx's deadline: it returns
	// the server's last error at once. Default 0: the first error is
	// returned, with its RetryAfter hint, for the caller to act on.
	CreateRetries int
	// Logger gets a Debug record for each retry (its attempt, the wait and
	// the server's message); default slog.Default().
	Logger *slog.Logger

	// keyHint says why no key was found in the admin key file, when
	// LoadConfig found one there but could not read it.
	keyHint string
}

// fileConfig is the user config file, ~/.config/dsec/config.toml.
type fileConfig struct {
	Version int    `toml:"version"`
	Addr    string `toml:"addr"`
	APIKey  string `toml:"api_key"`
}

// configFileVersion is the only version of the config file this package
// reads.
const configFileVersion = 1

// ConfigPath returns the user config file's path:
// $XDG_CONFIG_HOME/dsec/config.toml, else ~/.config/dsec/config.toml. It is
// empty when neither variable leads to a directory.
func ConfigPath() string {
	if x := os.Getenv("XDG_CONFIG_HOME"); x != "" && filepath.IsAbs(x) {
		return filepath.Join(x, "dsec", "config.toml")
	}
	home, err := os.UserHomeDir()
	if err != nil || home == "" {
		return ""
	}
	return filepath.Join(home, ".config", "dsec", "config.toml")
}

// LoadConfig completes overrides the way every dsec client does
// (CONTRACT.md). Each field takes the first of:
//
//   - Addr: overrides.Addr, $DSEC_ADDR, addr in the config file, DefaultAddr.
//   - APIKey: overrides.APIKey (the --api-key flag), $DSEC_API_KEY, api_key
//     in the config file, then the admin key <state-dir>/admin.key.
//   - StateDir: overrides.StateDir, $DSEC_STATE_DIR, DefaultStateDir.
//
// The config file is ConfigPath(). A missing file or admin key is not an
// error: calls made without a key fail with ErrUnauthenticated and a message
// naming the places looked at. A config file that cannot be read or parsed,
// or an address that is not an http(s) URL, is an error.
func LoadConfig(overrides Config) (Config, error) {
	cfg := overrides

	var file fileConfig
	path := ConfigPath()
	if path != "" {
		f, err := readConfigFile(path)
		if err != nil {
			return Config{}, err
		}
		file = f
	}

	cfg.Addr = firstNonEmpty(overrides.Addr, os.Getenv("DSEC_ADDR"), file.Addr, DefaultAddr)
	addr, err := normalizeAddr(cfg.Addr)
	if err != nil {
		return Config{}, err
	}
	cfg.Addr = addr

	cfg.StateDir = firstNonEmpty(overrides.StateDir, os.Getenv("DSEC_STATE_DIR"), DefaultStateDir)
	cfg.APIKey = firstNonEmpty(overrides.APIKey, os.Getenv("DSEC_API_KEY"), strings.TrimSpace(file.APIKey))
	if cfg.APIKey == "" {
		cfg.APIKey, cfg.keyHint = readAdminKey(cfg.StateDir)
	}
	return cfg, nil
}

func firstNonEmpty(vals ...string) string {
	for _, v := range vals {
		if v != "" {
			return v
		}
	}
	return ""
}

// readConfigFile reads the config file at path; a missing file is empty.
func readConfigFile(path string) (fileConfig, error) {
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return fileConfig{}, nil
	}
	if err != nil {
		return fileConfig{}, newError(ErrInvalidArgument, "read config file: %v", err)
	}
	f, err := parseConfigFile(data)
	if err != nil {
		return fileConfig{}, newError(ErrInvalidArgument, "config file %s: %v", path, err)
	}
	return f, nil
}

// parseConfigFile parses the config file's contents. Keys it does not know
// are ignored, so newer tools can add some; a version it does not know is
// an error.
func parseConfigFile(data []byte) (fileConfig, error) {
	var f fileConfig
	if _, err := toml.Decode(string(data), &f); err != nil {
		return fileConfig{}, fmt.Errorf("%v (want TOML such as: version = 1, addr = %q, api_key = \"...\")", err, DefaultAddr)
	}
	if f.Version != 0 && f.Version != configFileVersion {
		return fileConfig{}, fmt.Errorf("version = %d is not supported: this client reads version = %d", f.Version, configFileVersion)
	}
	return f, nil
}

// readAdminKey returns the key in <stateDir>/admin.key, or a hint saying why
// the file was there but not usable.
func readAdminKey(stateDir string) (key, hint string) {
	path := filepath.Join(stateDir, "admin.key")
	data, err := os.ReadFile(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return "", ""
	case errors.Is(err, fs.ErrPermission):
		return "", fmt.Sprintf("%s exists but this user may not read it: ask an admin for a key (`dsec key create`)", path)
	case err != nil:
		return "", fmt.Sprintf("read %s: %v", path, err)
	}
	return strings.TrimSpace(string(data)), ""
}

// normalizeAddr checks that addr is an http(s) URL with a host and returns
// it without a trailing slash.
func normalizeAddr(addr string) (string, error) {
	u, err := url.Parse(addr)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.RawQuery != "" || u.Fragment != "" {
		return "", newError(ErrInvalidArgument, "API address %q is not an http:// or https:// URL (example: %s)", addr, DefaultAddr)
	}
	return strings.TrimRight(addr, "/"), nil
}

// missingKeyMessage explains where a key was looked for.
func missingKeyMessage(hint string) string {
	msg := "no API key: pass one (--api-key, Config.APIKey), set DSEC_API_KEY, " +
		"put api_key in " + displayConfigPath() + ", or run as a user who can read " +
		"<state-dir>/admin.key (state dir: --state-dir, DSEC_STATE_DIR, default " + DefaultStateDir + ")"
	if hint != "" {
		msg += "; " + hint
	}
	return msg
}

func displayConfigPath() string {
	if p := ConfigPath(); p != "" {
		return p
	}
	return "~/.config/dsec/config.toml"
}
