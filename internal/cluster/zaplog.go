package cluster

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"

	"github.com/soheilhy/cmux"
	etcderrors "go.etcd.io/etcd/server/v3/etcdserver/errors"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"google.golang.org/grpc"
)

// newZapLogger returns a zap logger, as etcd wants one, that forwards entries
// at min and above to lg.
func newZapLogger(lg *slog.Logger, min zapcore.Level) *zap.Logger {
	return zap.New(&slogCore{lg: lg, min: min})
}

// slogCore is a zapcore.Core writing to a slog.Logger.
type slogCore struct {
	lg     *slog.Logger
	min    zapcore.Level
	fields []zapcore.Field // from With, written before the entry's own
}

var _ zapcore.Core = (*slogCore)(nil)

func (c *slogCore) Enabled(l zapcore.Level) bool {
	return l >= c.min && c.lg.Enabled(context.Background(), slogLevel(l))
}

func (c *slogCore) With(fields []zapcore.Field) zapcore.Core {
	return &slogCore{lg: c.lg, min: c.min, fields: append(slices.Clip(c.fields), fields...)}
}

func (c *slogCore) Check(e zapcore.Entry, ce *zapcore.CheckedEntry) *zapcore.CheckedEntry {
	if c.Enabled(e.Level) {
		return ce.AddCore(e, c)
	}
	return ce
}

func (c *slogCore) Write(e zapcore.Entry, fields []zapcore.Field) error {
	level := slogLevel(e.Level)
	if benignMessages[e.Message] || isShutdownNoise(fields) {
		level = slog.LevelDebug
	}
	if !c.lg.Enabled(context.Background(), level) {
		return nil
	}
	enc := zapcore.NewMapObjectEncoder()
	for _, f := range c.fields {
		f.AddTo(enc)
	}
	for _, f := range fields {
		f.AddTo(enc)
	}
	r := slog.NewRecord(e.Time, level, "etcd: "+e.Message, 0)
	for _, k := range slices.Sorted(maps.Keys(enc.Fields)) {
		r.AddAttrs(slog.Any(k, enc.Fields[k]))
	}
	return c.lg.Handler().Handle(context.Background(), r)
}

func (c *slogCore) Sync() error { return nil }

func slogLevel(l zapcore.Level) slog.Level {
	switch {
	case l <= zapcore.DebugLevel:
		return slog.LevelDebug
	case l == zapcore.InfoLevel:
		return slog.LevelInfo
	case l == zapcore.WarnLevel:
		return slog.LevelWarn
	default:
		return slog.LevelError
	}
}

// benignMessages are warnings etcd logs on every start of the embedded
// configuration and that need no action: one listener serves gRPC and HTTP
// (only its owner can reach the socket), and etcd auth is off, so its
// "simple" token is never used. They are logged at Debug.
var benignMessages = map[string]bool{
	"Running http and grpc server on single port. This is not recommended for production.": true,
	"simple token is not cryptographically signed":                                         true,
}

// isShutdownNoise reports whether an entry is about a listener or server
// that stopped because etcd is closing: etcd logs those at Warn and Error on
// every ordinary Close (and a cluster version update that a Close soon
// after the start cancelled: ErrCanceled is the server's own context
// ending). They are logged at Debug.
func isShutdownNoise(fields []zapcore.Field) bool {
	for _, f := range fields {
		if f.Type != zapcore.ErrorType {
			continue
		}
		err, ok := f.Interface.(error)
		if !ok {
			continue
		}
		if errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) ||
			errors.Is(err, cmux.ErrServerClosed) || errors.Is(err, cmux.ErrListenerClosed) ||
			errors.Is(err, grpc.ErrServerStopped) ||
			errors.Is(err, etcderrors.ErrCanceled) || errors.Is(err, etcderrors.ErrStopped) {
			return true
		}
	}
	return false
}
