package edge

import (
	"context"
	"slices"

	"connectrpc.com/connect"

	imagev1 "github.com/dsecproject/dsec/api/dsec/image/v1"
	"github.com/dsecproject/dsec/api/dsec/image/v1/imagev1connect"
)

// layerUseAPI tells the control plane which layers this node's sandboxes
// mount, so that layer garbage collection never removes one in use.
type layerUseAPI struct{ e *Edge }

var _ imagev1connect.LayerUseServiceHandler = (*layerUseAPI)(nil)

// ListLayerUse lists every sandbox the node has a record of, whatever its
// state: a record is inserted, with its layers, before the backend mounts
// them, and removed only once the backend let go of them.
func (a *layerUseAPI) ListLayerUse(_ context.Context, _ *connect.Request[imagev1.ListLayerUseRequest]) (*connect.Response[imagev1.ListLayerUseResponse], error) {
	recs, err := a.e.store.list()
	if err != nil {
		return nil, err
	}
	out := &imagev1.ListLayerUseResponse{}
	for _, r := range recs {
		sl := &imagev1.SandboxLayers{SandboxId: r.ID, Project: r.Project}
		for _, l := range r.Layers {
			sl.LayerDigests = append(sl.LayerDigests, l.Digest)
		}
		out.Sandboxes = append(out.Sandboxes, sl)
	}
	slices.SortFunc(out.Sandboxes, func(a, b *imagev1.SandboxLayers) int {
		if a.SandboxId < b.SandboxId {
			return -1
		}
		if a.SandboxId > b.SandboxId {
			return 1
		}
		return 0
	})
	return connect.NewResponse(out), nil
}
