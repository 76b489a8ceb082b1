package main

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"time"
)

// apiCmd calls the platform's API as the sandbox's own key (dsec-api):
//
//	probe api ADDR PROCEDURE JSON [stream]
//
// ADDR is host[:port] of the API (the sandbox's gateway: the test image
// resolves no names), PROCEDURE a Connect procedure
// (dsec.sandbox.v1.SandboxService/Get), JSON the request. With stream the
// call is a server stream (Exec, Attach, ReadFile): the request goes in
// one envelope. It prints the HTTP status on the first line, then the
// answer: a unary call's body, or one line per message of a stream and
// its end-of-stream message. A forged admin key is sent on every call.
func apiCmd(args []string) error {
	if len(args) < 3 {
		return fmt.Errorf("usage: probe api ADDR PROCEDURE JSON [stream]")
	}
	addr, proc, body := args[0], args[1], []byte(args[2])
	stream := len(args) > 3 && args[3] == "stream"
	ct := "application/json"
	if stream {
		ct = "application/connect+json"
		var env bytes.Buffer
		env.WriteByte(0)
		binary.Write(&env, binary.BigEndian, uint32(len(body)))
		env.Write(body)
		body = env.Bytes()
	}
	req, err := http.NewRequest(http.MethodPost, "http://"+addr+"/"+strings.TrimPrefix(proc, "/"), bytes.NewReader(body))
	if err != nil {
		return err
	}
	req.Host = "api.dsec.internal"
	req.Header.Set("Content-Type", ct)
	req.Header.Set("Authorization", "Bearer dsec_forged_admin_key")
	resp, err := (&http.Client{Timeout: 30 * time.Second}).Do(req)
	if err != nil {
		fmt.Println("0")
		fmt.Println(err)
		return nil
	}
	defer resp.Body.Close()
	fmt.Println(resp.StatusCode)
	if !stream {
		b, _ := io.ReadAll(resp.Body)
		fmt.Println(string(b))
		return nil
	}
	for {
		var head [5]byte
		if _, err := io.ReadFull(resp.Body, head[:]); err != nil {
			return nil
		}
		msg := make([]byte, binary.BigEndian.Uint32(head[1:]))
		if _, err := io.ReadFull(resp.Body, msg); err != nil {
			return nil
		}
		fmt.Println(string(msg))
	}
}
