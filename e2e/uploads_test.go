package e2e

import (
	"archive/tar"
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/api/dsec/sandbox/v1/sandboxv1connect"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// testBrokenUpload checks that an upload whose request body breaks keeps
// nothing: not the part of a file, nor the entries of a partial archive.
func testBrokenUpload(t *testing.T, p *platform, c *dsec.Client) {
	ctx := ctxT(t)
	sb, err := c.Create(ctx, dsec.CreateOptions{Image: "busybox", Labels: map[string]string{"job": "upload"}})
	if err != nil {
		t.Fatal(err)
	}
	defer sb.Delete(t.Context())
	if err := sb.WriteFile(ctx, "/keep.txt", []byte("old")); err != nil {
		t.Fatal(err)
	}
	// A whole first entry and no end of archive: read to its end, it is a
	// valid archive of one file.
	var archive bytes.Buffer
	tw := tar.NewWriter(&archive)
	_ = tw.WriteHeader(&tar.Header{Name: "t.txt", Mode: 0o644, Size: 7, Typeflag: tar.TypeReg})
	_, _ = tw.Write([]byte("partial"))
	_ = tw.Flush()

	key := p.AdminKey(t)
	const tries = 20
	for range tries {
		brokenUpload(t, p.Addr, key, sandboxv1connect.SandboxServiceWriteFileProcedure,
			&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Header{Header: &sandboxv1.WriteFileHeader{SandboxId: sb.ID, Path: "/keep.txt"}}},
			&sandboxv1.WriteFileRequest{Msg: &sandboxv1.WriteFileRequest_Data{Data: []byte("partial")}})
		brokenUpload(t, p.Addr, key, sandboxv1connect.SandboxServiceUploadTarProcedure,
			&sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Header{Header: &sandboxv1.UploadTarHeader{SandboxId: sb.ID, Path: "/d", MakeParents: true}}},
			&sandboxv1.UploadTarRequest{Msg: &sandboxv1.UploadTarRequest_Data{Data: archive.Bytes()}})
	}
	// The edge may end a call after the API server answered.
	time.Sleep(500 * time.Millisecond)
	if got, err := sb.ReadFile(ctx, "/keep.txt"); err != nil || string(got) != "old" {
		t.Errorf("after %d broken writes, /keep.txt = %q, %v; want the old content", tries, got, err)
	}
	if _, err := sb.Stat(ctx, "/d"); !errors.Is(err, dsec.ErrNotFound) {
		t.Errorf("after %d broken archive uploads, Stat(/d) = %v; want NotFound (nothing extracted)", tries, err)
	}
	// The sandbox takes whole uploads as before.
	if err := sb.WriteFile(ctx, "/keep.txt", []byte("new")); err != nil {
		t.Fatal(err)
	}
	if got, err := sb.ReadFile(ctx, "/keep.txt"); err != nil || string(got) != "new" {
		t.Errorf("ReadFile after a whole write = %q, %v; want new", got, err)
	}
}

// brokenUpload sends an upload of header and data over HTTP/1.1, then
// breaks its body with a malformed chunk, as the Python SDK does when its
// source fails, and checks that the answer is an error.
func brokenUpload(t *testing.T, addr, key, procedure string, header, data proto.Message) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
	var body []byte
	for _, m := range []proto.Message{header, data} {
		b, err := proto.Marshal(m)
		if err != nil {
			t.Fatal(err)
		}
		body = append(binary.BigEndian.AppendUint32(append(body, 0), uint32(len(b))), b...)
	}
	req := fmt.Appendf(nil, "POST %s HTTP/1.1\r\nHost: dsec\r\nAuthorization: Bearer %s\r\n"+
		"Content-Type: application/connect+proto\r\nConnect-Protocol-Version: 1\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n",
		procedure, key, len(body), body)
	if _, err := conn.Write(req); err != nil {
		t.Fatal(err)
	}
	// Give the API server time to pass the data on to the edge.
	time.Sleep(50 * time.Millisecond)
	if _, err := conn.Write([]byte("zz\r\n")); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("%s: read the answer: %v", procedure, err)
	}
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if !bytes.Contains(answer, []byte(`"error"`)) {
		t.Errorf("%s with a broken body: HTTP %d %q, want an error", procedure, resp.StatusCode, answer)
	}
}
