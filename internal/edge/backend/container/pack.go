package container

import (
	"context"

	"github.com/dsecproject/dsec/internal/keeper"
	"github.com/dsecproject/dsec/internal/sandbox"
)

var _ sandbox.Packer = (*Backend)(nil)

// PackDiff has the node keeper freeze the sandbox, build a layer of its
// writable layer (owners shifted back into the sandbox's ids) and thaw it.
func (b *Backend) PackDiff(ctx context.Context, id string, scrub []string) (*sandbox.PackedLayer, error) {
	p, err := b.keeper.PackDiff(ctx, keeper.PackRequest{Sandbox: id, Scrub: scrub})
	if err != nil {
		return nil, err
	}
	return &sandbox.PackedLayer{Digest: p.Digest, Size: p.Size, Files: p.Files, Frozen: p.Frozen, Body: p.Body}, nil
}
