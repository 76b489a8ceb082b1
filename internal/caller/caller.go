// Package caller is who makes a request, as the control plane
// authenticated it, and how that travels to an edge: HTTP headers that an
// edge believes only together with the node token. The API server sets
// them (SetHeader) and the edge reads them (FromHeader); neither imports
// the other.
package caller

import "net/http"

// The headers of a request from the control plane to an edge.
const (
	HeaderProject = "Dsec-Project"
	HeaderAdmin   = "Dsec-Admin"
	HeaderKeyID   = "Dsec-Key-Id"
	// HeaderRollout names the rollout whose member's own key (dsec-api)
	// makes the request: the edge then shows it that rollout and its
	// members only.
	HeaderRollout = "Dsec-Rollout"
	// HeaderNodeToken carries the cluster's node token, without which an
	// edge refuses the call and believes none of the headers above.
	HeaderNodeToken = "Dsec-Node-Token"
)

// Caller is who makes a request.
type Caller struct {
	Project string
	Admin   bool
	// KeyID names the API key; idempotency keys are scoped to it.
	KeyID string
	// Rollout, when set, is the rollout whose member's own key makes the
	// request: it sees and acts on that rollout and its members only.
	Rollout string
}

// FromHeader reads the caller of a request to an edge.
func FromHeader(h http.Header) Caller {
	return Caller{Project: h.Get(HeaderProject), Admin: h.Get(HeaderAdmin) == "1", KeyID: h.Get(HeaderKeyID), Rollout: h.Get(HeaderRollout)}
}

// SetHeader writes c into the headers of a request to an edge, replacing
// what they said.
func (c Caller) SetHeader(h http.Header) {
	h.Set(HeaderProject, c.Project)
	h.Set(HeaderKeyID, c.KeyID)
	if c.Rollout != "" {
		h.Set(HeaderRollout, c.Rollout)
	} else {
		h.Del(HeaderRollout)
	}
	if c.Admin {
		h.Set(HeaderAdmin, "1")
	} else {
		h.Del(HeaderAdmin)
	}
}
