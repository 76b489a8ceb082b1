package cgroup

// V2Dir returns the group's cgroup2 directory ("" in V1 mode, without a
// cgroup2 hierarchy): a process started into it (clone3's
// CLONE_INTO_CGROUP) is in the group from its first instruction, and a
// cgroup namespace it makes there has the group as its root.
func (m *Manager) V2Dir(name string) string {
	if checkName(name) != nil {
		return ""
	}
	return m.v2Dir(name)
}
