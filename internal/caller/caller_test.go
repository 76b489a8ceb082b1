package caller

import (
	"net/http"
	"testing"
)

func TestHeaderRoundTrip(t *testing.T) {
	for _, c := range []Caller{{}, {Project: "team-a", KeyID: "k1"}, {Project: "default", Admin: true, KeyID: "adm"}, {Project: "team-a", KeyID: "sandbox", Rollout: "n1-r-abcdefghijkl"}} {
		h := http.Header{}
		h.Set(HeaderAdmin, "1")                     // a stale value is replaced
		h.Set(HeaderRollout, "n1-r-forgedforged12") // and so is a rollout
		c.SetHeader(h)
		if got := FromHeader(h); got != c {
			t.Errorf("FromHeader(SetHeader(%+v)) = %+v", c, got)
		}
	}
}
