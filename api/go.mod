module github.com/dsecproject/dsec/api

// The floor is connect v1.21.1's (go 1.26.0).
go 1.26.0

require (
	connectrpc.com/connect v1.21.1
	github.com/google/go-cmp v0.7.0 // tests only
	google.golang.org/protobuf v1.36.12
)
