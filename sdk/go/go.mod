module github.com/dsecproject/dsec/sdk/go

// The floor is connect v1.21.1's (go 1.26.0); the SDK itself needs Go 1.25
// (os.Root's MkdirAll, Symlink, Link, Chmod, Chtimes, Readlink).
go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/BurntSushi/toml v1.6.0
	github.com/dsecproject/dsec/api v0.0.0-00010101000000-000000000000
	github.com/google/go-cmp v0.7.0
	go.uber.org/goleak v1.3.0
	google.golang.org/genproto/googleapis/rpc v0.0.0-20260803160001-6ac0973c030d
	google.golang.org/protobuf v1.36.12
)

// During development the SDK builds against the API module of this tree; a
// release requires a tagged api/vX.Y.Z instead (replace only applies here).
replace github.com/dsecproject/dsec/api => ../../api
