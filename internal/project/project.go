// Package project names the projects the platform keeps for itself.
//
// A project is the unit of tenancy: an API key acts in one, and a sandbox
// belongs to the project of the key that created it. Names starting with
// ReservedPrefix belong to the platform's own services (today the
// SandboxFusion API's pool, SandboxFusion).
//
// Invariants, kept by the packages that enforce them:
//   - no API key is ever created in a reserved project, and a stored key
//     of one never authenticates (internal/cluster, internal/apiserver);
//     only a service key, held in the memory of the process that runs
//     the service, acts in one;
//   - admin keys see every project's sandboxes but the reserved ones
//     (internal/edge), so an operator's `dsec ps` or `dsec rm -l` neither
//     shows nor touches a service's sandboxes.
package project

import "strings"

// Default is the project of a key created without one.
const Default = "default"

// ReservedPrefix starts the name of every reserved project.
const ReservedPrefix = "dsec-"

// SandboxFusion is the project of the SandboxFusion API's sandboxes.
const SandboxFusion = ReservedPrefix + "sandboxfusion"

// Reserved reports whether name is a project of the platform's own.
func Reserved(name string) bool { return strings.HasPrefix(name, ReservedPrefix) }
