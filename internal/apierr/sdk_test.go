package apierr_test

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"connectrpc.com/connect"

	adminv1 "github.com/dsecproject/dsec/api/dsec/admin/v1"
	"github.com/dsecproject/dsec/api/dsec/admin/v1/adminv1connect"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// failingAdmin answers WhoAmI with err, converted by the server's table.
type failingAdmin struct {
	adminv1connect.UnimplementedAdminServiceHandler
	err error
}

func (a failingAdmin) WhoAmI(context.Context, *connect.Request[adminv1.WhoAmIRequest]) (*connect.Response[adminv1.WhoAmIResponse], error) {
	return nil, apierr.ToConnect(a.err)
}

// whoAmI serves failingAdmin{err} and returns what the Go SDK (its own
// module) makes of the answer.
func whoAmI(t *testing.T, err error) error {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle(adminv1connect.NewAdminServiceHandler(failingAdmin{err: err}))
	srv := httptest.NewUnstartedServer(mux)
	srv.Config.Protocols = new(http.Protocols)
	srv.Config.Protocols.SetHTTP1(true)
	srv.Config.Protocols.SetUnencryptedHTTP2(true)
	srv.Start()
	t.Cleanup(srv.Close)
	c, cerr := dsec.New(dsec.Config{Addr: srv.URL, APIKey: "dsec_test"})
	if cerr != nil {
		t.Fatalf("dsec.New: %v", cerr)
	}
	t.Cleanup(func() { c.Close() })
	_, got := c.WhoAmI(t.Context())
	return got
}

// TestSDKInverse sends every kind through this package's table to the Go
// SDK, which holds the inverse in its own module: the client must see the
// same kind (the same sentinel: both are the API module's errkind values),
// the message and the retry hint.
func TestSDKInverse(t *testing.T) {
	for _, kind := range errdefs.Kinds {
		t.Run(kind.Error(), func(t *testing.T) {
			msg := "sandbox sb-a: do something about it"
			err := whoAmI(t, errdefs.Newf(kind, "%s", msg))
			var de *dsec.Error
			if !errors.As(err, &de) {
				t.Fatalf("WhoAmI failing with %v = %T %v, want *dsec.Error", kind, err, err)
			}
			if de.Kind != kind || !errors.Is(err, kind) {
				t.Errorf("WhoAmI failing with %v: kind %v, want %v", kind, de.Kind, kind)
			}
			// Internal errors keep their text in the server's log.
			if kind != errdefs.ErrInternal && de.Message != msg {
				t.Errorf("WhoAmI failing with %v: message %q, want %q", kind, de.Message, msg)
			}
		})
	}
	err := whoAmI(t, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrResourceExhausted, "node full: try again later"), 1500*time.Millisecond))
	var de *dsec.Error
	if !errors.As(err, &de) || de.Kind != dsec.ErrResourceExhausted || de.RetryAfter != 1500*time.Millisecond {
		t.Errorf("WhoAmI on a full node = %#v, want ResourceExhausted with RetryAfter 1.5s", err)
	}
}
