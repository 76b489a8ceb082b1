// Package streams adapts Connect streams: the data messages of an upload
// as an io.Reader, and a server stream relayed from an edge to a client.
package streams

import (
	"io"

	"connectrpc.com/connect"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// First receives the first message of a client stream, which must be
// its header (header returns ok for it).
func First[T any](s *connect.ClientStream[T], what string, header func(*T) bool) (*T, error) {
	if !s.Receive() {
		if err := s.Err(); err != nil {
			return nil, err
		}
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: no header", what)
	}
	if !header(s.Msg()) {
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: the first message must be the header", what)
	}
	return s.Msg(), nil
}

// Reader returns the data of the rest of a client stream. data returns a
// message's bytes, or ok false for a message that is not data (a second
// header), which is an error. A stream the client cancels ends with its
// error, never with io.EOF, so that nothing half-sent is kept.
func Reader[T any](s *connect.ClientStream[T], what string, data func(*T) ([]byte, bool)) io.Reader {
	return &reader[T]{s: s, what: what, data: data}
}

type reader[T any] struct {
	s    *connect.ClientStream[T]
	what string
	data func(*T) ([]byte, bool)
	buf  []byte
}

func (r *reader[T]) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if !r.s.Receive() {
			if err := r.s.Err(); err != nil {
				return 0, err
			}
			return 0, io.EOF
		}
		b, ok := r.data(r.s.Msg())
		if !ok {
			return 0, errdefs.Newf(errdefs.ErrInvalidArgument, "%s: a second header", r.what)
		}
		r.buf = b
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// Relay sends every message of src to dst until src ends, and returns
// src's error (nil at a clean end).
func Relay[T any](dst *connect.ServerStream[T], src *connect.ServerStreamForClient[T]) error {
	defer src.Close()
	for src.Receive() {
		if err := dst.Send(src.Msg()); err != nil {
			return err
		}
	}
	return src.Err()
}
