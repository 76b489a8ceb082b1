package main

import (
	"bytes"
	"encoding/json"
	"io"
	"io/fs"
	"strings"
	"time"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/sdk/go/dsec"
)

// -o json prints the API's own JSON: protobuf's canonical JSON mapping of
// its messages (lowerCamelCase names, durations like "900s", timestamps in
// RFC 3339, zero fields left out), the JSON the API itself speaks. The SDK's
// structs are turned back into the messages they came from, never
// marshaled as Go structs (Go names, nanoseconds).

// encodeProtos writes items, each as the API message conv makes of it, as
// an indented JSON array.
func encodeProtos[T any, M proto.Message](w io.Writer, items []T, conv func(T) M) error {
	var buf bytes.Buffer
	buf.WriteByte('[')
	for i, it := range items {
		if i > 0 {
			buf.WriteByte(',')
		}
		b, err := protojson.Marshal(conv(it))
		if err != nil {
			return err
		}
		buf.Write(b)
	}
	buf.WriteByte(']')
	return writeIndented(w, buf.Bytes())
}

// encodeProto writes one message as indented JSON.
func encodeProto(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	return writeIndented(w, b)
}

// writeIndented re-indents protojson's output (whose spacing protobuf
// varies on purpose) the way the CLI's other JSON is indented.
func writeIndented(w io.Writer, b []byte) error {
	var out bytes.Buffer
	if err := json.Indent(&out, b, "", "  "); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err := w.Write(out.Bytes())
	return err
}

func timeProto(t time.Time) *timestamppb.Timestamp {
	if t.IsZero() {
		return nil
	}
	return timestamppb.New(t)
}

func durationProto(d time.Duration) *durationpb.Duration {
	if d == 0 {
		return nil
	}
	return durationpb.New(d)
}

func stateProto(s string) sandboxv1.State {
	if v, ok := sandboxv1.State_value["STATE_"+strings.ToUpper(s)]; ok {
		return sandboxv1.State(v)
	}
	return sandboxv1.State_STATE_UNSPECIFIED
}

func sandboxProto(sb *dsec.Sandbox) *sandboxv1.Sandbox {
	return &sandboxv1.Sandbox{
		Id:      sb.ID,
		Image:   sb.Image,
		Labels:  sb.Labels,
		State:   stateProto(sb.State),
		Reason:  sb.Reason,
		Node:    sb.Node,
		Backend: sb.Backend,
		Project: sb.Project,
		Resources: &sandboxv1.Resources{
			MemoryBytes: sb.Resources.Memory,
			Cpus:        sb.Resources.CPUs,
			Pids:        sb.Resources.Pids,
			DiskBytes:   sb.Resources.Disk,
		},
		CreatedAt:       timeProto(sb.CreatedAt),
		ExpiresAt:       timeProto(sb.ExpiresAt),
		IdleTtl:         durationProto(sb.IdleTTL),
		IdleExpiresAt:   timeProto(sb.IdleExpiresAt),
		User:            sb.User,
		Workdir:         sb.Workdir,
		Env:             sb.Env,
		IdleAction:      sb.IdleAction,
		PausedTtl:       durationProto(sb.PausedTTL),
		PausedAt:        timeProto(sb.PausedAt),
		PausedExpiresAt: timeProto(sb.PausedExpiresAt),
		Rollout:         sb.Rollout,
	}
}

func exitProto(st *dsec.ExitStatus) *sandboxv1.ExecExit {
	if st == nil {
		return nil
	}
	return &sandboxv1.ExecExit{
		ExitCode:         int32(st.ExitCode),
		Signal:           int32(st.Signal),
		TimedOut:         st.TimedOut,
		OomKilled:        st.OOMKilled,
		StdoutTruncated:  st.StdoutTruncated,
		StderrTruncated:  st.StderrTruncated,
		Duration:         durationProto(st.Duration),
		Lost:             st.Lost,
		Sealed:           st.Sealed,
		SessionLost:      st.SessionLost,
		SessionRestarted: st.SessionRestarted,
	}
}

func execInfoProto(e dsec.ExecInfo) *sandboxv1.ExecInfo {
	return &sandboxv1.ExecInfo{
		ExecId:      e.ID,
		Argv:        e.Argv,
		Tty:         e.TTY,
		StartedAt:   timeProto(e.StartedAt),
		Running:     e.Running,
		Exit:        exitProto(e.Exit),
		StdoutBytes: e.StdoutBytes,
		StderrBytes: e.StderrBytes,
		Session:     e.Session,
		Sealed:      e.Sealed,
		StepKey:     e.StepKey,
	}
}

func sessionProto(s dsec.SessionInfo) *sandboxv1.Session {
	return &sandboxv1.Session{Name: s.Name, Shell: s.Shell, CreatedAt: timeProto(s.CreatedAt),
		Commands: s.Commands, RunningExecId: s.RunningExecID}
}

func fileInfoProto(fi dsec.FileInfo) *sandboxv1.FileInfo {
	return &sandboxv1.FileInfo{Path: fi.Path, Name: fi.Name, Type: fi.Type, LinkTarget: fi.LinkTarget,
		Size: fi.Size, Mode: uint32(fi.Mode.Perm()) | modeBits(fi.Mode), ModTime: timeProto(fi.ModTime),
		IsDir: fi.IsDir, Uid: uint32(fi.UID), Gid: uint32(fi.GID)}
}

// modeBits are the setuid, setgid and sticky bits of m as st_mode has them.
func modeBits(m fs.FileMode) uint32 {
	var b uint32
	if m&fs.ModeSetuid != 0 {
		b |= 0o4000
	}
	if m&fs.ModeSetgid != 0 {
		b |= 0o2000
	}
	if m&fs.ModeSticky != 0 {
		b |= 0o1000
	}
	return b
}

// statsJSON is one sandbox's stats: the API's StatsResponse, with the
// sandbox's ID and, when sampled, cpuPercent.
func statsJSON(r statsRow) (json.RawMessage, error) {
	b, err := protojson.Marshal(&sandboxv1.StatsResponse{
		CpuUsage: durationpb.New(r.CPU), CpusLimit: r.CPUs, MemoryBytes: r.Memory, MemoryLimit: r.MemoryLimit,
		Pids: r.Pids, PidsLimit: r.PidsLimit, DiskBytes: r.Disk, DiskLimit: r.DiskLimit, OomKills: r.OOMKills,
		OutputBytes: r.Output, OutputLimit: r.OutputLimit,
		NetBytesOut: r.NetOut, NetBytesIn: r.NetIn, NetConnectionsOut: r.NetConnections, NetDenied: r.NetDenied,
		Networked: r.Networked, SwappedBytes: r.Swapped,
	})
	if err != nil {
		return nil, err
	}
	m := map[string]json.RawMessage{}
	if err := json.Unmarshal(b, &m); err != nil {
		return nil, err
	}
	m["sandboxId"], _ = json.Marshal(r.ID)
	if r.CPUPercent != nil {
		m["cpuPercent"], _ = json.Marshal(*r.CPUPercent)
	}
	return json.Marshal(m)
}

func eventProto(ev dsec.Event) *sandboxv1.Event {
	p := &sandboxv1.Event{Reason: ev.Reason, Time: timeProto(ev.Time)}
	if v, ok := sandboxv1.EventType_value["EVENT_TYPE_"+strings.ToUpper(ev.Type)]; ok {
		p.Type = sandboxv1.EventType(v)
	}
	if ev.Sandbox != nil {
		p.Sandbox = sandboxProto(ev.Sandbox)
	}
	return p
}

// writeProtoLine writes m as JSON on one line.
func writeProtoLine(w io.Writer, m proto.Message) error {
	b, err := protojson.Marshal(m)
	if err != nil {
		return err
	}
	var out bytes.Buffer
	if err := json.Compact(&out, b); err != nil {
		return err
	}
	out.WriteByte('\n')
	_, err = w.Write(out.Bytes())
	return err
}

func layerProto(l dsec.Layer) *imagev1.Layer {
	return &imagev1.Layer{Digest: l.Digest, Size: l.Size, MediaType: l.MediaType}
}

func imageProto(im *dsec.Image) *imagev1.Image {
	if im == nil {
		return nil
	}
	p := &imagev1.Image{Name: im.Name, CreatedAt: timeProto(im.CreatedAt), Size: im.Size, Project: im.Project, Public: im.Public,
		Config: &imagev1.ImageConfig{Env: im.Config.Env, Workdir: im.Config.Workdir, User: im.Config.User,
			Entrypoint: im.Config.Entrypoint, Cmd: im.Config.Cmd}}
	for _, l := range im.Layers {
		p.Layers = append(p.Layers, layerProto(l))
	}
	return p
}

func usageProtos(us []dsec.LayerUsage) []*imagev1.LayerUsage {
	out := make([]*imagev1.LayerUsage, 0, len(us))
	for _, u := range us {
		out = append(out, &imagev1.LayerUsage{Layer: layerProto(u.Layer), CreatedAt: timeProto(u.CreatedAt),
			Images: u.Images, Sandboxes: u.Sandboxes})
	}
	return out
}

func inspectProto(d *dsec.ImageDetails) *imagev1.InspectImageResponse {
	return &imagev1.InspectImageResponse{Image: imageProto(d.Image), Layers: usageProtos(d.Layers)}
}

func diskUsageProto(d *dsec.DiskUsage) *imagev1.DiskUsageResponse {
	return &imagev1.DiskUsageResponse{Layers: usageProtos(d.Layers), LayerCount: d.LayerCount, TotalBytes: d.TotalBytes,
		SharedCount: d.SharedCount, SharedBytes: d.SharedBytes, UniqueCount: d.UniqueCount, UniqueBytes: d.UniqueBytes,
		UnreferencedInUseCount: d.UnreferencedInUseCount, UnreferencedInUseBytes: d.UnreferencedInUseBytes,
		ReclaimableCount: d.ReclaimableCount, ReclaimableBytes: d.ReclaimableBytes,
		ImageCount: d.Images, SandboxCount: d.Sandboxes}
}

func packProto(p *dsec.Pack) *sandboxv1.PackDiffResponse {
	return &sandboxv1.PackDiffResponse{Image: p.Image, LayerDigest: p.LayerDigest, LayerSize: p.LayerSize,
		Layers: p.Layers, Files: p.Files, Frozen: durationpb.New(p.Frozen), Duration: durationpb.New(p.Duration)}
}

func gcProto(r *dsec.GCResult) *imagev1.GarbageCollectResponse {
	p := &imagev1.GarbageCollectResponse{RemovedBytes: r.RemovedBytes}
	for _, l := range r.Removed {
		p.Removed = append(p.Removed, layerProto(l))
	}
	for _, l := range r.OrphanBlobs {
		p.OrphanBlobs = append(p.OrphanBlobs, layerProto(l))
	}
	for _, k := range r.Kept {
		p.Kept = append(p.Kept, &imagev1.KeptLayer{Layer: layerProto(k.Layer), Reason: k.Reason})
	}
	return p
}
