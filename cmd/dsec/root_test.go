package main

import (
	"bytes"
	"strings"
	"testing"
)

func TestVerbOf(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{nil, ""},
		{[]string{"exec", "ID", "--", "true"}, "exec"},
		{[]string{"--addr", "http://h:1", "--api-key", "k", "ps", "-a"}, "ps"},
		{[]string{"--state-dir=/s", "--addr=http://h:1", "rm", "x"}, "rm"},
		{[]string{"--addr"}, ""},
		{[]string{"--help"}, ""},
		{[]string{"--version", "exec"}, ""},
		{[]string{"-h", "exec"}, ""},
		{[]string{"help", "exec"}, "help"},
		{[]string{"exce"}, "exce"},
	}
	for _, tt := range tests {
		if got := verbOf(tt.args); got != tt.want {
			t.Errorf("verbOf(%q) = %q, want %q", tt.args, got, tt.want)
		}
	}
}

// TestRootForVerb: the root made for a client verb has that verb (named as
// the table says) and no other client verb; for anything else, every verb.
func TestRootForVerb(t *testing.T) {
	full := newRootCmd()
	for _, v := range clientVerbs {
		root := newRootCmdFor(v.name)
		var clients []string
		for _, c := range root.Commands() {
			if isClientVerb(c.Name()) {
				clients = append(clients, c.Name())
			}
		}
		if len(clients) != 1 || clients[0] != v.name {
			t.Errorf("root for %s has client verbs %v, want just it (is the table's name its command's?)", v.name, clients)
		}
	}
	for _, verb := range []string{"", "help", "completion", "exce", "up"} {
		if n, want := len(newRootCmdFor(verb).Commands()), len(full.Commands()); n != want {
			t.Errorf("root for %q has %d verbs, want all %d", verb, n, want)
		}
	}
	// An unknown verb is still met with a suggestion of the known ones.
	root := newRootCmdFor("exce")
	root.SetArgs([]string{"exce"})
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	if err := root.Execute(); err == nil || !strings.Contains(err.Error(), "exec") {
		t.Errorf("dsec exce = %v, want an error that suggests exec", err)
	}
}

func isClientVerb(name string) bool {
	for _, v := range clientVerbs {
		if v.name == name {
			return true
		}
	}
	return false
}
