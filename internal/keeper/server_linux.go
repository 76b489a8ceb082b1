package keeper

import (
	"context"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/dsecproject/dsec/internal/errdefs"
)

func (k *Keeper) handler(stop func()) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/version", func(w http.ResponseWriter, r *http.Request) {
		v := Version{Protocol: Protocol, Version: k.cfg.Version, Pid: os.Getpid(), Runtime: filepath.Base(k.cfg.Runtime)}
		if clientProtocol(r) < 3 {
			// A protocol 2 client requires a keeper of protocol 2, which
			// this one is to it: it reads every reply of this keeper and
			// sends only requests this keeper reads.
			v.Protocol = 2
		} else {
			s := k.currentSettings()
			v.MinProtocol, v.Settings, v.Drivers = MinProtocol, &s, k.driverNames()
		}
		reply(w, v, nil)
	})
	mux.HandleFunc("POST /v1/settings", func(w http.ResponseWriter, r *http.Request) {
		var s Settings
		if err := decode(r, &s); err != nil {
			reply(w, nil, err)
			return
		}
		got, err := k.applySettings(s)
		reply(w, got, err)
	})
	mux.HandleFunc("POST /v1/sandbox/create", func(w http.ResponseWriter, r *http.Request) {
		var req CreateRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		info, err := k.create(r.Context(), req)
		reply(w, info, err)
	})
	mux.HandleFunc("POST /v1/sandbox/delete", func(w http.ResponseWriter, r *http.Request) {
		// Deletion finishes even if the caller goes away.
		reply(w, nil, k.delete(context.WithoutCancel(r.Context()), r.URL.Query().Get("id")))
	})
	mux.HandleFunc("GET /v1/sandbox/status", func(w http.ResponseWriter, r *http.Request) {
		b, err := k.lookup(r.URL.Query().Get("id"))
		if err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, b.snapshot(), nil)
	})
	mux.HandleFunc("GET /v1/sandbox/list", func(w http.ResponseWriter, r *http.Request) {
		reply(w, k.list(), nil)
	})
	mux.HandleFunc("GET /v1/sandbox/stats", func(w http.ResponseWriter, r *http.Request) {
		st, err := k.stats(r.URL.Query().Get("id"))
		reply(w, st, err)
	})
	mux.HandleFunc("POST /v1/sandbox/pause", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		info, start, err := k.pause(r.Context(), q.Get("id"), q.Get("wait") == "1")
		reply(w, info, err)
		if start != nil {
			// The move out begins once the reply is on its way.
			if f, ok := w.(http.Flusher); ok {
				f.Flush()
			}
			start()
		}
	})
	mux.HandleFunc("POST /v1/sandbox/resume", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		info, err := k.resume(r.Context(), q.Get("id"), q.Get("wait") == "1")
		reply(w, info, err)
	})
	mux.HandleFunc("GET /v1/sandbox/pause", func(w http.ResponseWriter, r *http.Request) {
		info, err := k.pauseState(r.URL.Query().Get("id"))
		reply(w, info, err)
	})
	mux.HandleFunc("POST /v1/exec/start", func(w http.ResponseWriter, r *http.Request) {
		var req ExecRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, nil, k.startExec(r.Context(), req))
	})
	mux.HandleFunc("GET /v1/exec/wait", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		timeout, err := time.ParseDuration(q.Get("timeout"))
		if err != nil || timeout <= 0 || timeout > 5*time.Minute {
			timeout = 30 * time.Second
		}
		rec, ok, err := k.waitExec(r.Context(), q.Get("sandbox"), q.Get("exec"), timeout)
		if err == nil && !ok {
			w.WriteHeader(http.StatusAccepted)
			return
		}
		reply(w, rec, err)
	})
	mux.HandleFunc("POST /v1/exec/stdin", func(w http.ResponseWriter, r *http.Request) {
		var req StdinRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, nil, k.writeStdin(r.Context(), req.Sandbox, req.Exec, req.Data, req.Close))
	})
	mux.HandleFunc("POST /v1/exec/signal", func(w http.ResponseWriter, r *http.Request) {
		var req SignalRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, nil, k.signal(req.Sandbox, req.Exec, req.Signal))
	})
	mux.HandleFunc("POST /v1/exec/resize", func(w http.ResponseWriter, r *http.Request) {
		var req ResizeRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		reply(w, nil, k.resize(req.Sandbox, req.Exec, req.Rows, req.Cols))
	})
	mux.HandleFunc("GET /v1/exec/list", func(w http.ResponseWriter, r *http.Request) {
		execs, err := k.listExecs(r.URL.Query().Get("sandbox"))
		reply(w, execs, err)
	})
	mux.HandleFunc("GET /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		ss, err := k.listSessions(r.URL.Query().Get("sandbox"))
		reply(w, sessionsReply{Sessions: ss}, err)
	})
	mux.HandleFunc("DELETE /v1/sessions", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		reply(w, nil, k.deleteSession(q.Get("sandbox"), q.Get("name")))
	})
	mux.HandleFunc("GET /v1/chunkcache/stats", func(w http.ResponseWriter, r *http.Request) {
		if k.ct == nil || k.ct.lazy == nil {
			reply(w, nil, errdefs.Newf(errdefs.ErrNotFound, "this keeper has no chunk cache: start dsec up with --blob-source"))
			return
		}
		reply(w, k.ct.lazy.cache.Stats(), nil)
	})
	mux.HandleFunc("GET /v1/events", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		timeout, err := time.ParseDuration(q.Get("timeout"))
		if err != nil || timeout <= 0 || timeout > 5*time.Minute {
			timeout = 30 * time.Second
		}
		evs, next := k.events.since(r.Context(), q.Get("cursor"), timeout)
		reply(w, EventsReply{Events: evs, Cursor: next}, nil)
	})
	mux.HandleFunc("PUT /v1/network", func(w http.ResponseWriter, r *http.Request) {
		var req NetworkRequest
		if err := decode(r, &req); err != nil {
			reply(w, nil, err)
			return
		}
		info, err := k.setNetwork(r.Context(), r.URL.Query().Get("sandbox"), req)
		reply(w, info, err)
	})
	mux.HandleFunc("GET /v1/network", func(w http.ResponseWriter, r *http.Request) {
		info, err := k.network(r.URL.Query().Get("sandbox"))
		reply(w, info, err)
	})
	mux.HandleFunc("GET /v1/network/node", func(w http.ResponseWriter, r *http.Request) {
		reply(w, k.nodeNetwork(), nil)
	})
	mux.HandleFunc("DELETE /v1/network", func(w http.ResponseWriter, r *http.Request) {
		reply(w, nil, k.deleteNetwork(r.URL.Query().Get("sandbox")))
	})
	k.packRoutes(mux)
	mux.HandleFunc("POST /v1/shutdown", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("handoff") == "1" && q.Get("kill") != "1" {
			// Protocol 3: the keeper replacing this one takes the vault
			// over (vault_linux.go).
			ln, err := k.listenHandoff()
			if err != nil {
				reply(w, nil, err)
				return
			}
			k.mu.Lock()
			k.handoff = ln
			k.mu.Unlock()
		}
		k.shutdown(context.WithoutCancel(r.Context()), q.Get("kill") == "1")
		reply(w, nil, nil)
		stop()
	})
	return checkProtocol(mux)
}

// clientProtocol is the protocol a request's client speaks: its
// Dsec-Keeper-Protocol header, or 2 (which sent none).
func clientProtocol(r *http.Request) int {
	h := r.Header.Get(headerProtocol)
	if h == "" {
		return 2
	}
	n, err := strconv.Atoi(h)
	if err != nil || n < 1 {
		return 0
	}
	return n
}

// checkProtocol refuses clients older than MinProtocol. A newer client is
// served: it uses only what this keeper's protocol has (policy in api.go).
func checkProtocol(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if p := clientProtocol(r); p < MinProtocol {
			reply(w, nil, errdefs.Newf(errdefs.ErrFailedPrecondition,
				"this node keeper serves keeper protocols %d to %d, the client speaks %q: upgrade dsec", MinProtocol, Protocol, r.Header.Get(headerProtocol)))
			return
		}
		h.ServeHTTP(w, r)
	})
}

// decode reads a request body. Fields it does not know are ignored: a
// newer client adds only fields whose absence means the old behaviour
// (policy in api.go).
func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(nil, r.Body, 64<<20))
	if err := dec.Decode(v); err != nil {
		return errdefs.Newf(errdefs.ErrInvalidArgument, "keeper request: %v", err)
	}
	return nil
}

func reply(w http.ResponseWriter, v any, err error) {
	w.Header().Set("Content-Type", "application/json")
	if err != nil {
		status := http.StatusInternalServerError
		switch errdefs.Kind(err) {
		case errdefs.ErrNotFound:
			status = http.StatusNotFound
		case errdefs.ErrInvalidArgument:
			status = http.StatusBadRequest
		case errdefs.ErrAlreadyExists, errdefs.ErrFailedPrecondition:
			status = http.StatusConflict
		case errdefs.ErrResourceExhausted:
			status = http.StatusTooManyRequests
		case errdefs.ErrUnavailable:
			status = http.StatusServiceUnavailable
		}
		w.WriteHeader(status)
		_ = json.NewEncoder(w).Encode(encodeError(err))
		return
	}
	if v == nil {
		w.WriteHeader(http.StatusNoContent)
		return
	}
	_ = json.NewEncoder(w).Encode(v)
}
