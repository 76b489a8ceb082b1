//go:build !dsec_client

package main

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/dsecproject/dsec/internal/blobsource"
)

func newBlobserverCmd() *cobra.Command {
	var (
		store, listen, tokenFile string
		rate                     int64
		latency                  time.Duration
	)
	cmd := &cobra.Command{
		Use:   "blobserver --store DIR --listen ADDR",
		Short: verbShort("blobserver"),
		Long: `Serve the blobs of a local blob store (a directory with a sha256/ subdirectory,
as dsec keeps them) read-only over HTTP: GET and HEAD of /blobs/sha256/<hex>
(also /blobs/sha256:<hex> and /v2/<repo>/blobs/sha256:<hex>), with Range
requests. Nodes read lazy layers from it with the blob source
"http://ADDR".

--rate caps the bytes per second sent by all requests together and --latency
delays each response: together they simulate shared storage in tests and
benchmarks. --token-file requires "Authorization: Bearer <token>".`,
		Example: `  dsec blobserver --store /var/lib/dsec/blobs --listen 127.0.0.1:7430
  dsec blobserver --store ./blobs --listen :7430 --rate 200000000 --latency 2ms`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if store == "" || listen == "" {
				return usageErrorf("--store and --listen are required")
			}
			if rate < 0 || latency < 0 {
				return usageErrorf("--rate and --latency cannot be negative")
			}
			opts := blobsource.ServerOptions{Rate: rate, Latency: latency}
			if tokenFile != "" {
				b, err := os.ReadFile(tokenFile)
				if err != nil {
					return fmt.Errorf("read --token-file: %w", err)
				}
				opts.Token = strings.TrimSpace(string(b))
				if opts.Token == "" {
					return usageErrorf("--token-file %s is empty", tokenFile)
				}
			}
			h, err := blobsource.NewServer(store, opts)
			if err != nil {
				return err
			}
			ln, err := net.Listen("tcp", listen)
			if err != nil {
				return fmt.Errorf("listen: %w", err)
			}
			log := slog.New(slog.NewTextHandler(os.Stderr, nil))
			log.Info("blobserver listening", "addr", ln.Addr().String(), "store", store, "rate", rate, "latency", latency)
			srv := &http.Server{Handler: h, ReadHeaderTimeout: 10 * time.Second}
			ctx, stop := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			errc := make(chan error, 1)
			go func() { errc <- srv.Serve(ln) }()
			select {
			case err := <-errc:
				return fmt.Errorf("serve: %w", err)
			case <-ctx.Done():
			}
			sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, context.DeadlineExceeded) {
				return fmt.Errorf("shut down: %w", err)
			}
			<-errc
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&store, "store", "", "blob store directory (holding sha256/)")
	f.StringVar(&listen, "listen", "", "address to listen on, such as 127.0.0.1:7430")
	f.Int64Var(&rate, "rate", 0, "cap on bytes per second sent, shared by all requests (0: none)")
	f.DurationVar(&latency, "latency", 0, "delay added before each response")
	f.StringVar(&tokenFile, "token-file", "", "file holding a bearer token that requests must carry")
	return cmd
}
