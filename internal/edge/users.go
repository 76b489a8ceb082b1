package edge

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"strconv"
	"strings"

	"github.com/dsecproject/dsec/internal/errdefs"
)

// identity is a resolved user inside a sandbox.
type identity struct {
	UID, GID uint32
	Groups   []uint32
	Home     string
	Name     string
}

// userSpec is a parsed user string: "", "name", "uid", "uid:gid",
// "name:group".
type userSpec struct {
	user, group string
}

func parseUserSpec(s string) (userSpec, error) {
	if len(s) > 256 || strings.ContainsAny(s, "\x00\n") {
		return userSpec{}, errdefs.Newf(errdefs.ErrInvalidArgument, "user %.80q: want NAME, UID, UID:GID or NAME:GROUP", s)
	}
	u, g, _ := strings.Cut(s, ":")
	if strings.Contains(g, ":") {
		return userSpec{}, errdefs.Newf(errdefs.ErrInvalidArgument, "user %.80q: want NAME, UID, UID:GID or NAME:GROUP", s)
	}
	return userSpec{user: u, group: g}, nil
}

// fileReader reads a file of the sandbox, nil when it does not exist.
type fileReader func(ctx context.Context, path string) ([]byte, error)

// resolveUser maps a user string to ids using the sandbox's /etc/passwd and
// /etc/group. Numeric ids need no files; names must exist.
func resolveUser(ctx context.Context, s string, read fileReader) (identity, error) {
	spec, err := parseUserSpec(s)
	if err != nil {
		return identity{}, err
	}
	if spec.group == "" && (spec.user == "" || spec.user == "0" || spec.user == "root") {
		// The common case needs no file: root is 0:0 with home /root.
		return identity{UID: 0, GID: 0, Home: "/root", Name: "root"}, nil
	}
	id := identity{Home: "/"}
	var passwd []passwdEntry
	uid, numeric := parseID(spec.user)
	if !numeric || spec.group == "" {
		b, err := read(ctx, "/etc/passwd")
		switch {
		case err == nil:
			passwd = parsePasswd(b)
		case !numeric || !errdefs.Is(err, errdefs.ErrNotFound):
			return identity{}, err
		}
	}
	found := false
	for _, e := range passwd {
		if (numeric && e.uid == uid) || (!numeric && e.name == spec.user) {
			id.UID, id.GID, id.Home, id.Name = e.uid, e.gid, e.home, e.name
			found = true
			break
		}
	}
	switch {
	case !found && !numeric:
		return identity{}, errdefs.Newf(errdefs.ErrInvalidArgument, "user %.80q does not exist in the sandbox (no entry in /etc/passwd): use a numeric UID or create the user", spec.user)
	case !found:
		id.UID, id.GID = uid, uid
		if uid == 0 {
			id.Home = "/root"
		}
	}
	if spec.group != "" {
		if gid, ok := parseID(spec.group); ok {
			id.GID = gid
		} else {
			b, err := read(ctx, "/etc/group")
			if err != nil {
				return identity{}, err
			}
			g, ok := lookupGroup(parseGroups(b), spec.group)
			if !ok {
				return identity{}, errdefs.Newf(errdefs.ErrInvalidArgument, "group %.80q does not exist in the sandbox (no entry in /etc/group)", spec.group)
			}
			id.GID = g
		}
	}
	if id.Name != "" {
		if b, err := read(ctx, "/etc/group"); err == nil {
			for _, g := range parseGroups(b) {
				for _, m := range g.members {
					if m == id.Name && g.gid != id.GID {
						id.Groups = append(id.Groups, g.gid)
					}
				}
			}
		}
	}
	return id, nil
}

func parseID(s string) (uint32, bool) {
	n, err := strconv.ParseUint(s, 10, 32)
	return uint32(n), err == nil
}

type passwdEntry struct {
	name     string
	uid, gid uint32
	home     string
}

// parsePasswd reads passwd(5) lines, skipping malformed ones.
func parsePasswd(b []byte) []passwdEntry {
	var out []passwdEntry
	sc := bufio.NewScanner(io.LimitReader(bytes.NewReader(b), 4<<20))
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 7 || f[0] == "" {
			continue
		}
		uid, ok1 := parseID(f[2])
		gid, ok2 := parseID(f[3])
		if !ok1 || !ok2 {
			continue
		}
		out = append(out, passwdEntry{name: f[0], uid: uid, gid: gid, home: f[5]})
	}
	return out
}

type groupEntry struct {
	name    string
	gid     uint32
	members []string
}

func parseGroups(b []byte) []groupEntry {
	var out []groupEntry
	sc := bufio.NewScanner(io.LimitReader(bytes.NewReader(b), 4<<20))
	sc.Buffer(make([]byte, 4096), 64<<10)
	for sc.Scan() {
		f := strings.Split(sc.Text(), ":")
		if len(f) < 4 || f[0] == "" {
			continue
		}
		gid, ok := parseID(f[2])
		if !ok {
			continue
		}
		var members []string
		if f[3] != "" {
			members = strings.Split(f[3], ",")
		}
		out = append(out, groupEntry{name: f[0], gid: gid, members: members})
	}
	return out
}

func lookupGroup(gs []groupEntry, name string) (uint32, bool) {
	for _, g := range gs {
		if g.name == name {
			return g.gid, true
		}
	}
	return 0, false
}
