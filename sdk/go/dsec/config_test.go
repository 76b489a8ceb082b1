package dsec

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
)

// configEnv is one test's environment and files.
type configEnv struct {
	addrEnv, keyEnv string
	stateDirEnv     bool   // set DSEC_STATE_DIR to the temp state dir
	xdg             bool   // put the config file under XDG_CONFIG_HOME instead of HOME
	file            string // config file contents; "" for none
	adminKey        string // admin.key contents; "" for none
}

func TestLoadConfig(t *testing.T) {
	const fileOK = "version = 1\naddr = \"http://file:7420\"\napi_key = \"file-key\"\n"
	tests := []struct {
		name      string
		env       configEnv
		overrides Config
		want      Config // StateDir "STATE" means the temp state dir
	}{
		{
			name: "defaults",
			env:  configEnv{stateDirEnv: true},
			want: Config{Addr: DefaultAddr, StateDir: "STATE"},
		},
		{
			name: "admin key of the state dir",
			env:  configEnv{stateDirEnv: true, adminKey: "admin-key\n"},
			want: Config{Addr: DefaultAddr, APIKey: "admin-key", StateDir: "STATE"},
		},
		{
			name:      "explicit state dir",
			env:       configEnv{adminKey: "admin-key"},
			overrides: Config{StateDir: "STATE"},
			want:      Config{Addr: DefaultAddr, APIKey: "admin-key", StateDir: "STATE"},
		},
		{
			name: "config file over admin key",
			env:  configEnv{stateDirEnv: true, file: fileOK, adminKey: "admin-key"},
			want: Config{Addr: "http://file:7420", APIKey: "file-key", StateDir: "STATE"},
		},
		{
			name: "config file under XDG_CONFIG_HOME",
			env:  configEnv{stateDirEnv: true, xdg: true, file: fileOK},
			want: Config{Addr: "http://file:7420", APIKey: "file-key", StateDir: "STATE"},
		},
		{
			name: "config file without version",
			env:  configEnv{stateDirEnv: true, file: "api_key = \"k\"\nfuture_key = true\n"},
			want: Config{Addr: DefaultAddr, APIKey: "k", StateDir: "STATE"},
		},
		{
			name: "environment over config file",
			env:  configEnv{stateDirEnv: true, file: fileOK, adminKey: "admin-key", addrEnv: "https://env.example/", keyEnv: "env-key"},
			want: Config{Addr: "https://env.example", APIKey: "env-key", StateDir: "STATE"},
		},
		{
			name:      "explicit over environment",
			env:       configEnv{stateDirEnv: true, file: fileOK, addrEnv: "http://env:1", keyEnv: "env-key"},
			overrides: Config{Addr: "http://flag:2", APIKey: "flag-key", UserAgent: "me"},
			want:      Config{Addr: "http://flag:2", APIKey: "flag-key", StateDir: "STATE", UserAgent: "me"},
		},
		{
			name: "default state dir",
			env:  configEnv{keyEnv: "env-key"},
			want: Config{Addr: DefaultAddr, APIKey: "env-key", StateDir: DefaultStateDir},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			state := setupConfigEnv(t, tt.env)
			over := tt.overrides
			if over.StateDir == "STATE" {
				over.StateDir = state
			}
			want := tt.want
			if want.StateDir == "STATE" {
				want.StateDir = state
			}
			got, err := LoadConfig(over)
			if err != nil {
				t.Fatalf("LoadConfig(%+v) = %v", over, err)
			}
			if diff := cmp.Diff(want, got, cmpopts.IgnoreUnexported(Config{})); diff != "" {
				t.Errorf("LoadConfig(%+v) (-want +got):\n%s", over, diff)
			}
		})
	}
}

// setupConfigEnv makes a temporary HOME, XDG_CONFIG_HOME and state dir with
// env's files and variables, and returns the state dir.
func setupConfigEnv(t *testing.T, env configEnv) string {
	t.Helper()
	home, xdg, state := t.TempDir(), t.TempDir(), t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("XDG_CONFIG_HOME", "")
	t.Setenv("DSEC_ADDR", env.addrEnv)
	t.Setenv("DSEC_API_KEY", env.keyEnv)
	t.Setenv("DSEC_STATE_DIR", "")
	if env.stateDirEnv {
		t.Setenv("DSEC_STATE_DIR", state)
	}
	dir := filepath.Join(home, ".config", "dsec")
	if env.xdg {
		t.Setenv("XDG_CONFIG_HOME", xdg)
		dir = filepath.Join(xdg, "dsec")
		// A decoy where the file would be without XDG_CONFIG_HOME.
		writeFile(t, filepath.Join(home, ".config", "dsec", "config.toml"), "addr = \"http://decoy:1\"\n")
	}
	if env.file != "" {
		writeFile(t, filepath.Join(dir, "config.toml"), env.file)
	}
	if env.adminKey != "" {
		writeFile(t, filepath.Join(state, "admin.key"), env.adminKey)
	}
	return state
}

func writeFile(t *testing.T, path, data string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(data), 0o600); err != nil {
		t.Fatal(err)
	}
}

func TestLoadConfigErrors(t *testing.T) {
	tests := []struct {
		name     string
		env      configEnv
		addr     string
		wantText string
	}{
		{name: "malformed file", env: configEnv{file: "addr = \n"}, wantText: "config.toml"},
		{name: "newer version", env: configEnv{file: "version = 2\n"}, wantText: "version = 2"},
		{name: "bad env address", env: configEnv{addrEnv: "127.0.0.1:7420"}, wantText: "127.0.0.1:7420"},
		{name: "bad file address", env: configEnv{file: "addr = \"unix:///run/dsec.sock\"\n"}, wantText: "unix:///run/dsec.sock"},
		{name: "bad explicit address", addr: "localhost", wantText: "http://127.0.0.1:7420"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.env.stateDirEnv = true
			setupConfigEnv(t, tt.env)
			_, err := LoadConfig(Config{Addr: tt.addr})
			if !errors.Is(err, ErrInvalidArgument) || !strings.Contains(err.Error(), tt.wantText) {
				t.Errorf("LoadConfig = %v, want ErrInvalidArgument mentioning %q", err, tt.wantText)
			}
		})
	}
}

// TestUnreadableAdminKey: when admin.key is there but cannot be read, a
// call says so.
func TestUnreadableAdminKey(t *testing.T) {
	state := setupConfigEnv(t, configEnv{stateDirEnv: true})
	// A directory cannot be read as a file, even by root.
	if err := os.Mkdir(filepath.Join(state, "admin.key"), 0o700); err != nil {
		t.Fatal(err)
	}
	cfg, err := LoadConfig(Config{})
	if err != nil {
		t.Fatalf("LoadConfig: %v", err)
	}
	f := newFake()
	srv := f.serve(t, serverOpts{})
	cfg.Addr = srv.URL
	c, err := New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	defer c.Close()
	_, err = c.WhoAmI(t.Context())
	if !errors.Is(err, ErrUnauthenticated) || !strings.Contains(err.Error(), filepath.Join(state, "admin.key")) {
		t.Errorf("WhoAmI = %v, want ErrUnauthenticated naming the unreadable admin.key", err)
	}
}

func FuzzParseConfigFile(f *testing.F) {
	f.Add("version = 1\naddr = \"http://127.0.0.1:7420\"\napi_key = \"k\"\n")
	f.Add("version = 2\n")
	f.Add("[x]\ny = [1, 2]\n")
	f.Fuzz(func(t *testing.T, data string) {
		cfg, err := parseConfigFile([]byte(data))
		if err == nil && cfg.Version != 0 && cfg.Version != configFileVersion {
			t.Errorf("parseConfigFile(%q) accepted version %d", data, cfg.Version)
		}
	})
}
