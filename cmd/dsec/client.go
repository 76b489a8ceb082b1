package main

import (
	"errors"
	"fmt"
	"strings"

	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// client connects to the API the way every client command does.
func (g *globalFlags) client() (*dsec.Client, error) {
	cfg, err := dsec.LoadConfig(dsec.Config{Addr: g.addr, APIKey: g.apiKey, StateDir: g.stateDir})
	if err != nil {
		return nil, err
	}
	cfg.ShortLived = true
	return dsec.New(cfg)
}

// exitCodeOf is the process exit code of a dsec error: 125 for errors of
// the platform (like docker's), 2 for bad usage.
func exitCodeOf(err error) int {
	if errors.Is(err, errUsage) {
		return 2
	}
	return 125
}

var errUsage = errors.New("usage")

func usageErrorf(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{errUsage}, args...)...)
}

// parseKV parses repeated k=v flags.
func parseKV(what string, items []string) (map[string]string, error) {
	if len(items) == 0 {
		return nil, nil
	}
	m := make(map[string]string, len(items))
	for _, it := range items {
		k, v, ok := strings.Cut(it, "=")
		if !ok || k == "" {
			return nil, usageErrorf("%s %q: want KEY=VALUE", what, it)
		}
		m[k] = v
	}
	return m, nil
}
