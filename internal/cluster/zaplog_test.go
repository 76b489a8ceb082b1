package cluster

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"testing"

	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.uber.org/zap"
)

// TestZapLoggerShutdownNoise: what etcd logs because it is closing goes to
// Debug; any other warning reaches the log at Warn.
func TestZapLoggerShutdownNoise(t *testing.T) {
	for _, tc := range []struct {
		msg    string
		err    error
		logged bool
	}{
		{"failed to update cluster version", etcderrors.ErrCanceled, false},
		{"aborting cluster version update; server is stopped", etcderrors.ErrStopped, false},
		{"serving stopped", fmt.Errorf("accept: %w", net.ErrClosed), false},
		{"failed to update cluster version", etcderrors.ErrTimeout, true},
		{"something else", errors.New("disk full"), true},
	} {
		var buf lockedBuffer
		lg := newZapLogger(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn})), zap.WarnLevel)
		lg.Warn(tc.msg, zap.Error(tc.err))
		if got := strings.Contains(buf.String(), tc.msg); got != tc.logged {
			t.Errorf("Warn(%q, %v): logged = %v, want %v (%q)", tc.msg, tc.err, got, tc.logged, buf.String())
		}
	}
}
