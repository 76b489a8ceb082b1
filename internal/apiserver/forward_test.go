package apiserver

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/internal/cluster"
	"github.com/dsecproject/dsec/internal/edgeclient"
	"github.com/dsecproject/dsec/internal/watcher"
)

// upload is how an upload ended at the fake edge.
type upload struct {
	data string
	err  error // nil: the stream ended cleanly, so an edge would keep it
}

// fakeEdge is an edge whose uploads report how their stream ended.
type fakeEdge struct {
	sandboxv1connect.UnimplementedSandboxServiceHandler
	receiving chan struct{} // a message after the header arrived
	ended     chan upload
}

func (f *fakeEdge) WriteFile(_ context.Context, s *connect.ClientStream[sandboxv1.WriteFileRequest]) (*connect.Response[sandboxv1.WriteFileResponse], error) {
	if err := receive(f, s, (*sandboxv1.WriteFileRequest).GetData); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.WriteFileResponse{}), nil
}

func (f *fakeEdge) UploadTar(_ context.Context, s *connect.ClientStream[sandboxv1.UploadTarRequest]) (*connect.Response[sandboxv1.UploadTarResponse], error) {
	if err := receive(f, s, (*sandboxv1.UploadTarRequest).GetData); err != nil {
		return nil, err
	}
	return connect.NewResponse(&sandboxv1.UploadTarResponse{}), nil
}

// receive reads an upload to its end as the edge does, and reports it.
func receive[T any](f *fakeEdge, s *connect.ClientStream[T], data func(*T) []byte) error {
	var u upload
	for n := 0; s.Receive(); n++ {
		if n == 1 {
			f.receiving <- struct{}{}
		}
		u.data += string(data(s.Msg()))
	}
	u.err = s.Err()
	f.ended <- u
	return u.err
}

// relay is an API server in front of a fake edge.
type relay struct {
	addr, key string
	edge      *fakeEdge
}

const relayNode = "relay"

func newRelay(t *testing.T) *relay {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	// Not t.TempDir(): unix socket paths are short.
	dir, err := os.MkdirTemp("", "dsec-relay-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	etcd, err := cluster.StartEmbedded(ctx, cluster.EmbedConfig{Dir: filepath.Join(dir, "etcd"), Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { etcd.Close() })
	store := cluster.NewStore(etcd.Client(), cluster.StoreConfig{Logger: log})
	key, err := store.EnsureAdminKey(ctx, filepath.Join(dir, "admin.key"))
	if err != nil {
		t.Fatal(err)
	}

	// The edge listens on a unix socket and speaks HTTP/1.1 and h2c, as
	// the edge of dsec up does.
	fe := &fakeEdge{receiving: make(chan struct{}, 1), ended: make(chan upload, 1)}
	edgeSock := filepath.Join(dir, "edge.sock")
	edgeLn, err := net.Listen("unix", edgeSock)
	if err != nil {
		t.Fatal(err)
	}
	var protos http.Protocols
	protos.SetHTTP1(true)
	protos.SetUnencryptedHTTP2(true)
	mux := http.NewServeMux()
	mux.Handle(sandboxv1connect.NewSandboxServiceHandler(fe))
	serve(t, &http.Server{Handler: mux, Protocols: &protos}, edgeLn)
	reg, err := store.RegisterNode(ctx, cluster.Node{Name: relayNode, Addr: "unix://" + edgeSock})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { reg.Close() })

	pool := edgeclient.NewPool("token")
	t.Cleanup(pool.Close)
	w := watcher.New(ctx, watcher.Config{Nodes: store, Pool: pool, Logger: log})
	t.Cleanup(w.Close)
	api := New(Config{Cluster: store, Watcher: w, Pool: pool, Logger: log})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	serve(t, &http.Server{Handler: api.Handler(), Protocols: &protos}, ln)
	return &relay{addr: ln.Addr().String(), key: key, edge: fe}
}

// serve serves srv on ln until the test ends.
func serve(t *testing.T, srv *http.Server, ln net.Listener) {
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		srv.Close()
		<-done
	})
}

// envelope frames a message as a Connect stream does.
func envelope(t *testing.T, m proto.Message) []byte {
	t.Helper()
	b, err := proto.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return append(binary.BigEndian.AppendUint32([]byte{0}, uint32(len(b))), b...)
}

// chunk frames b as one HTTP/1.1 chunk.
func chunk(b []byte) []byte {
	return append(fmt.Appendf(nil, "%x\r\n", len(b)), append(b, "\r\n"...)...)
}

// ending is how a client's upload ends after its first data message.
type ending struct {
	name string
	// rest is what the client sends after the data message.
	rest []byte
	// hangUp closes the client's side of the connection after rest.
	hangUp bool
	clean  bool
}

var endings = []ending{
	{name: "Clean", rest: []byte("0\r\n\r\n"), clean: true},
	// What the Python SDK does when its source fails.
	{name: "MalformedChunk", rest: []byte("zz\r\n")},
	// A clean end of the HTTP body inside a Connect envelope.
	{name: "TruncatedEnvelope", rest: append(chunk([]byte{0, 0, 0, 0, 100, 'x'}), "0\r\n\r\n"...)},
	// The connection ends in the middle of the body.
	{name: "ConnectionClosed", rest: []byte("40\r\nshort"), hangUp: true},
}

// upload sends an upload that ends as e says once the edge has its data,
// and returns how the edge saw it end.
func (r *relay) upload(t *testing.T, procedure string, header, data proto.Message, e ending) upload {
	t.Helper()
	conn, err := net.DialTimeout("tcp", r.addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	head := "POST " + procedure + " HTTP/1.1\r\nHost: dsec\r\nAuthorization: Bearer " + r.key +
		"\r\nContent-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\nTransfer-Encoding: chunked\r\n\r\n"
	body := append(envelope(t, header), envelope(t, data)...)
	if _, err := conn.Write(append([]byte(head), chunk(body)...)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-r.edge.receiving:
	case u := <-r.edge.ended:
		t.Fatalf("the edge's upload ended (%v) before the client broke it", u.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the edge got no data in 10s")
	}
	if _, err := conn.Write(e.rest); err != nil {
		t.Fatal(err)
	}
	if e.hangUp {
		_ = conn.(*net.TCPConn).CloseWrite()
	}
	// A Connect stream answers 200 and puts its error in the message that
	// ends the stream.
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("read the answer: %v", err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if failed := bytes.Contains(answer, []byte(`"error"`)); resp.StatusCode != http.StatusOK || failed == e.clean {
		t.Errorf("the client was answered HTTP %d %q; want 200 and an error: %v", resp.StatusCode, answer, !e.clean)
	}
	select {
	case u := <-r.edge.ended:
		return u
	case <-time.After(10 * time.Second):
		t.Fatal("the edge's upload did not end in 10s")
		return upload{}
	}
}

// TestBrokenUploadIsNotCommitted checks that the API server never ends an
// upload to the edge cleanly when the client's stream broke: the edge
// would keep the part it got.
func TestBrokenUploadIsNotCommitted(t *testing.T) {
	r := newRelay(t)
	id := relayNode + "-aaaaaaaaaaaa"
	procs := []struct {
		name, procedure string
		header, data    proto.Message
	}{
		{"WriteFile", sandboxv1connect.SandboxServiceWriteFileProcedure,
			&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Header{Header: &sandboxv1.WriteFileHeader{SandboxId: id, Path: "/keep.txt"}}},
			&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Data{Data: []byte("partial")}}},
		{"UploadTar", sandboxv1connect.SandboxServiceUploadTarProcedure,
			&sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Header{Header: &sandboxv1.UploadTarHeader{SandboxId: id, Path: "/d"}}},
			&sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Data{Data: []byte("partial")}}},
	}
	// The race this guards against lost about one upload in four; 25
	// tries of each kind make a pass by luck very unlikely.
	const tries = 25
	for _, p := range procs {
		for _, e := range endings {
			t.Run(p.name+"/"+e.name, func(t *testing.T) {
				kept := 0
				for range tries {
					u := r.upload(t, p.procedure, p.header, p.data, e)
					if u.data != "partial" {
						t.Fatalf("the edge got %q, want the data sent before the end", u.data)
					}
					if u.err == nil {
						kept++
					}
				}
				switch {
				case e.clean && kept != tries:
					t.Errorf("%d of %d whole uploads ended with an error at the edge, want none", tries-kept, tries)
				case !e.clean && kept > 0:
					t.Errorf("%d of %d broken uploads ended cleanly at the edge, which would keep them; want an error every time", kept, tries)
				}
			})
		}
	}
}
