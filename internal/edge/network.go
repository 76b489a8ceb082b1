package edge

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"sync"
	"time"

	"connectrpc.com/connect"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	sandboxv1 "github.com/dsecproject/dsec/api/dsec/sandbox/v1"
	"github.com/dsecproject/dsec/internal/apierr"
	"github.com/dsecproject/dsec/internal/errdefs"
	"github.com/dsecproject/dsec/internal/netpolicy"
	"github.com/dsecproject/dsec/internal/sandbox"
)

// A sandbox's network policy is validated here (internal/netpolicy,
// against the node's catalogue), kept in its record as the policy's JSON
// document, and given to the backend (sandbox.NetworkPolicer) once the
// sandbox runs, before its create returns; a restart of the edge gives
// every running sandbox its policy again. A sandbox without a policy has
// loopback only and costs nothing more.

// NetworkSpecOf converts a request's policy. nil and mode none without
// rules give nil: no network.
func NetworkSpecOf(m *sandboxv1.NetworkPolicy) (*netpolicy.Spec, error) {
	if m == nil {
		return nil, nil
	}
	var spec netpolicy.Spec
	switch {
	case m.GetText() != "" && (m.GetMode() != "" || len(m.GetRules()) > 0):
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network policy: give its text or its mode and rules, not both")
	case m.GetText() != "":
		f, err := netpolicy.ParseNetworkFlag(m.GetText())
		if err != nil {
			return nil, err
		}
		if f.File != "" {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network policy: policy=FILE names a file the server cannot read: send the file's rules instead")
		}
		spec = f.Spec
	default:
		doc, err := json.Marshal(policyDoc(m))
		if err != nil {
			return nil, err
		}
		if spec, err = netpolicy.ParsePolicyJSON(doc); err != nil {
			return nil, err
		}
	}
	return &spec, nil
}

// jsonRule is a rule of netpolicy's JSON document.
type jsonRule struct {
	Action   string   `json:"action"`
	Service  string   `json:"service,omitempty"`
	Domain   string   `json:"domain,omitempty"`
	CIDR     string   `json:"cidr,omitempty"`
	Ports    []string `json:"ports,omitempty"`
	Protocol string   `json:"protocol,omitempty"`
}

type jsonDoc struct {
	Mode  string     `json:"mode,omitempty"`
	Rules []jsonRule `json:"rules,omitempty"`
}

func policyDoc(m *sandboxv1.NetworkPolicy) jsonDoc {
	doc := jsonDoc{Mode: m.GetMode()}
	for _, r := range m.GetRules() {
		doc.Rules = append(doc.Rules, jsonRule{
			Action: r.GetAction(), Service: r.GetService(), Domain: r.GetDomain(), CIDR: r.GetCidr(),
			Ports: r.GetPorts(), Protocol: r.GetProtocol(),
		})
	}
	return doc
}

// NetworkProto is a stored policy document in the API's form; nil for
// none.
func NetworkProto(doc []byte) *sandboxv1.NetworkPolicy {
	if len(doc) == 0 {
		return nil
	}
	spec, err := netpolicy.ParsePolicyJSON(doc)
	if err != nil {
		return nil // stored documents were validated
	}
	return SpecProto(spec)
}

// SpecProto is spec in the API's form.
func SpecProto(spec netpolicy.Spec) *sandboxv1.NetworkPolicy {
	out := &sandboxv1.NetworkPolicy{Mode: string(spec.Mode)}
	if out.Mode == "" {
		out.Mode = string(netpolicy.ModeNone)
	}
	for _, r := range spec.Rules {
		pr := &sandboxv1.NetworkRule{Action: string(r.Action), Protocol: string(r.Protocol)}
		switch {
		case r.Service != "":
			pr.Target = &sandboxv1.NetworkRule_Service{Service: r.Service}
		case r.Domain != "":
			pr.Target = &sandboxv1.NetworkRule_Domain{Domain: r.Domain}
		default:
			pr.Target = &sandboxv1.NetworkRule_Cidr{Cidr: r.CIDR.String()}
		}
		for _, p := range r.Ports {
			pr.Ports = append(pr.Ports, p.String())
		}
		out.Rules = append(out.Rules, pr)
	}
	return out
}

// catalogue is the node's catalogue of services.
func (e *Edge) catalogue() *netpolicy.Catalogue {
	if e.cfg.Network != nil {
		return e.cfg.Network
	}
	return netpolicy.Builtin()
}

// compileNetwork checks spec against the node's catalogue (unknown
// services, mode open where the operator forbids it) and returns the
// document to store and enforce.
func (e *Edge) compileNetwork(spec netpolicy.Spec) ([]byte, error) {
	p, err := netpolicy.Compile(spec, e.catalogue())
	if err != nil {
		return nil, err
	}
	return netpolicy.MarshalPolicyJSON(p.Spec()), nil
}

// needsLink reports whether a stored policy can allow anything: one that
// cannot (none, or only deny rules, like network_rules={"npm": False}) is
// kept in the record, so that a later merge keeps its rules, but costs
// nothing: the sandbox gets no link until a policy allows something.
func needsLink(doc []byte) bool {
	if len(doc) == 0 {
		return false
	}
	spec, err := netpolicy.ParsePolicyJSON(doc)
	if err != nil {
		return true // stored documents were validated; let the backend say
	}
	if spec.Mode == netpolicy.ModeOpen {
		return true
	}
	for _, r := range spec.Rules {
		if r.Action == netpolicy.Allow {
			return true
		}
	}
	return false
}

// policer is be's network capability, or the refusal naming what to do.
func policer(be sandbox.Backend) (sandbox.NetworkPolicer, error) {
	np, ok := be.(sandbox.NetworkPolicer)
	if !ok {
		return nil, sandbox.Lacks(be.Describe().Name, sandbox.CapNetworkPolicy)
	}
	return np, nil
}

// mergeSpecs appends add's rules to old's. Mode open stays open, or is
// asked for by add; otherwise the result allows what its rules allow.
func mergeSpecs(old, add netpolicy.Spec) (netpolicy.Spec, error) {
	if add.Mode == netpolicy.ModeNone && len(add.Rules) == 0 {
		return old, errdefs.Newf(errdefs.ErrInvalidArgument, "merge adds rules to the policy and none has no rules: to take the network away, set none without merge")
	}
	mode := netpolicy.ModeRules
	if old.Mode == netpolicy.ModeOpen || add.Mode == netpolicy.ModeOpen {
		mode = netpolicy.ModeOpen
	}
	rules := append(append([]netpolicy.Rule(nil), old.Rules...), add.Rules...)
	return netpolicy.Spec{Mode: mode, Rules: rules}, nil
}

// NetworkResult is the outcome of a network update of one sandbox.
type NetworkResult struct {
	ID string
	// Policy is the document now in force, when Err is nil.
	Policy []byte
	Err    error
}

// UpdateNetwork replaces (or, with merge, extends) the network policy of
// sandbox id, or of every sandbox caller sees that sel matches, and
// enforces it. A bad policy fails the call; with a selector, what fails
// for one sandbox is in its result. By ID, a sandbox the caller may not
// see is NotFound.
func (e *Edge) UpdateNetwork(ctx context.Context, caller Caller, id string, sel map[string]string, spec netpolicy.Spec, merge bool) ([]NetworkResult, error) {
	if _, err := spec.Normalize(); err != nil {
		return nil, err
	}
	// Unknown services and a forbidden open fail the call, not each
	// sandbox; what merging with a sandbox's policy makes is checked per
	// sandbox.
	if _, err := e.compileNetwork(spec); err != nil {
		return nil, err
	}
	switch {
	case id != "" && len(sel) > 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network update takes a sandbox id or a selector, not both")
	case id != "":
		if _, err := e.lookup(caller, id); err != nil {
			return nil, err
		}
		doc, err := e.updateNetworkOne(ctx, caller, id, spec, merge)
		if err != nil {
			return nil, err
		}
		return []NetworkResult{{ID: id, Policy: doc}}, nil
	case len(sel) == 0:
		return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network update needs a sandbox id or a label selector")
	}
	recs, err := e.visible(caller, sel)
	if err != nil {
		return nil, err
	}
	out := make([]NetworkResult, len(recs))
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for i, r := range recs {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			doc, err := e.updateNetworkOne(ctx, caller, r.ID, spec, merge)
			out[i] = NetworkResult{ID: r.ID, Policy: doc, Err: err}
		}()
	}
	wg.Wait()
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out, nil
}

// updateNetworkOne stores sandbox id's new policy and enforces it; when
// the backend refuses it, the record keeps the policy it had. A paused
// sandbox is resumed first (a policy is enforced on a running sandbox).
func (e *Edge) updateNetworkOne(ctx context.Context, caller Caller, id string, spec netpolicy.Spec, merge bool) ([]byte, error) {
	_, done, err := e.ready(ctx, caller, id)
	if err != nil {
		return nil, err
	}
	defer done()
	unlock := e.netLocks.lock(id)
	defer unlock()
	r, err := e.store.get(id)
	if err != nil {
		return nil, err
	}
	switch {
	case r.State == StateCreating:
		return nil, errdefs.RetryAfter(errdefs.Newf(errdefs.ErrFailedPrecondition,
			"sandbox %s is being created: retry once it runs (its create gives it the policy it was created with)", r.ID), time.Second)
	case !r.active():
		return nil, errdefs.Newf(errdefs.ErrFailedPrecondition, "sandbox %s is %s (%s): create a new one", r.ID, r.State, r.Reason)
	}
	if merge && len(r.Network) > 0 {
		old, err := netpolicy.ParsePolicyJSON(r.Network)
		if err != nil {
			return nil, fmt.Errorf("sandbox %s: stored network policy: %w", id, err)
		}
		if spec, err = mergeSpecs(old, spec); err != nil {
			return nil, err
		}
	} else if merge {
		if spec, err = mergeSpecs(netpolicy.Spec{}, spec); err != nil {
			return nil, err
		}
	}
	doc, err := e.compileNetwork(spec)
	if err != nil {
		return nil, err
	}
	before := r.Network
	// A sandbox that never had a link needs none for a policy that allows
	// nothing; one that had keeps it, with the new policy.
	push := needsLink(doc) || needsLink(before)
	var np sandbox.NetworkPolicer
	if push {
		be, err := e.backend(r.Backend)
		if err != nil {
			return nil, err
		}
		if np, err = policer(be); err != nil {
			return nil, err
		}
	}
	updated, err := e.setNetworkRecord(id, doc)
	if err != nil {
		return nil, err
	}
	e.touch(id)
	if !push {
		e.publish(EventUpdated, updated, "network")
		return doc, nil
	}
	if _, err := np.SetNetwork(ctx, id, doc); err != nil {
		if _, rerr := e.setNetworkRecord(id, before); rerr != nil {
			e.log.Warn("restore network policy", "sandbox", id, "err", rerr)
		}
		return nil, fmt.Errorf("sandbox %s: set network: %w", id, err)
	}
	r, err = e.store.get(id)
	if err == nil {
		e.publish(EventUpdated, r, "network")
	}
	return doc, nil
}

func (e *Edge) setNetworkRecord(id string, doc []byte) (*Record, error) {
	return e.store.update(id, func(r *Record) error {
		if r.State == StateDeleting {
			return errdefs.Newf(errdefs.ErrNotFound, "sandbox %s is being deleted", id)
		}
		r.Network = doc
		return nil
	})
}

// NetworkState is a sandbox's network as GetNetwork reports it.
type NetworkState struct {
	// Policy is the stored document; nil is none.
	Policy []byte
	Info   sandbox.NetworkInfo
}

// GetNetwork reports sandbox id's network: the policy as set, and from
// the backend its addresses, counters and recent denials. A sandbox that
// never had a policy has none and no counters.
func (e *Edge) GetNetwork(ctx context.Context, caller Caller, id string) (NetworkState, error) {
	r, err := e.lookup(caller, id)
	if err != nil {
		return NetworkState{}, err
	}
	e.touch(id)
	st := NetworkState{Policy: r.Network}
	if !needsLink(r.Network) || !r.active() {
		return st, nil
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return NetworkState{}, err
	}
	np, err := policer(be)
	if err != nil {
		return NetworkState{}, err
	}
	if st.Info, err = np.Network(ctx, id); err != nil {
		return NetworkState{}, fmt.Errorf("sandbox %s: network: %w", id, err)
	}
	return st, nil
}

// networkCounters are r's network counters for Stats; zero without
// network, or when the backend cannot say (Stats does not fail for them).
func (e *Edge) networkCounters(ctx context.Context, r *Record) sandbox.NetworkInfo {
	if !needsLink(r.Network) || !r.active() {
		return sandbox.NetworkInfo{}
	}
	be, err := e.backend(r.Backend)
	if err != nil {
		return sandbox.NetworkInfo{}
	}
	np, err := policer(be)
	if err != nil {
		return sandbox.NetworkInfo{}
	}
	info, err := np.Network(ctx, r.ID)
	if err != nil {
		e.log.Debug("network counters", "sandbox", r.ID, "err", err)
		return sandbox.NetworkInfo{}
	}
	return info
}

// repushNetworks gives every running sandbox with a policy its policy
// again (at start: a keeper that lost it enforces it again).
func (e *Edge) repushNetworks(ctx context.Context) {
	recs, err := e.store.list()
	if err != nil {
		e.log.Warn("list sandboxes for their networks", "err", err)
		return
	}
	var wg sync.WaitGroup
	sem := make(chan struct{}, 8)
	for _, r := range recs {
		if !needsLink(r.Network) || !r.active() {
			continue
		}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			unlock := e.netLocks.lock(r.ID)
			defer unlock()
			be, err := e.backend(r.Backend)
			if err != nil {
				e.log.Warn("restore network policy", "sandbox", r.ID, "err", err)
				return
			}
			np, err := policer(be)
			if err == nil {
				cctx, cancel := context.WithTimeout(ctx, 30*time.Second)
				_, err = np.SetNetwork(cctx, r.ID, r.Network)
				cancel()
			}
			if err != nil {
				e.log.Warn("restore network policy", "sandbox", r.ID, "err", err)
			}
		}()
	}
	wg.Wait()
}

// networkProtoInfo is st in the API's form.
func networkProtoInfo(st NetworkState) *sandboxv1.GetNetworkResponse {
	i := st.Info
	out := &sandboxv1.GetNetworkResponse{
		Policy:  NetworkProto(st.Policy),
		Address: i.Address, Gateway: i.Router,
		BytesOut: i.BytesOut, BytesIn: i.BytesIn, ConnectionsOut: i.ConnsOut, ConnectionsActive: i.ConnsActive,
		Denied: i.Denied, DnsQueries: i.DNSQueries, DnsDenied: i.DNSDenied,
	}
	if out.Policy == nil {
		out.Policy = &sandboxv1.NetworkPolicy{Mode: string(netpolicy.ModeNone)}
	}
	for _, d := range i.Denials {
		out.Denials = append(out.Denials, &sandboxv1.NetworkDenial{
			Time: timestamppb.New(d.Time), Destination: d.Dest, Name: d.Name, Reason: d.Reason,
		})
	}
	return out
}

// itemError is err as one item of a reply: the API's code and what users
// may see of it (internal errors are the log's).
func (e *Edge) itemError(what, id string, err error) *sandboxv1.ItemError {
	out := &sandboxv1.ItemError{Code: apierr.Code(err).String()}
	msg, ok := apierr.Public(err)
	if !ok {
		e.log.Error(what, "sandbox", id, "err", err)
		msg = "internal error: the node's log has the details"
	}
	out.Message = msg
	if d, ok := errdefs.RetryHint(err); ok {
		out.RetryAfter = durationpb.New(d)
	}
	return out
}

func (a *sandboxAPI) UpdateNetwork(ctx context.Context, req *connect.Request[sandboxv1.UpdateNetworkRequest]) (*connect.Response[sandboxv1.UpdateNetworkResponse], error) {
	m := req.Msg
	spec, err := NetworkSpecOf(m.GetPolicy())
	if err != nil {
		return nil, err
	}
	if spec == nil {
		if m.GetMerge() {
			return nil, errdefs.Newf(errdefs.ErrInvalidArgument, "network update with merge needs rules to add")
		}
		spec = &netpolicy.Spec{Mode: netpolicy.ModeNone}
	}
	res, err := a.e.UpdateNetwork(ctx, callerOf(req.Header()), m.GetId(), m.GetSelector(), *spec, m.GetMerge())
	if err != nil {
		return nil, err
	}
	out := &sandboxv1.UpdateNetworkResponse{}
	for _, r := range res {
		pr := &sandboxv1.NetworkResult{Id: r.ID}
		if r.Err != nil {
			pr.Error = a.e.itemError("network update", r.ID, r.Err)
		} else {
			pr.Policy = NetworkProto(r.Policy)
			if pr.Policy == nil {
				pr.Policy = &sandboxv1.NetworkPolicy{Mode: string(netpolicy.ModeNone)}
			}
		}
		out.Results = append(out.Results, pr)
	}
	return connect.NewResponse(out), nil
}

func (a *sandboxAPI) GetNetwork(ctx context.Context, req *connect.Request[sandboxv1.GetNetworkRequest]) (*connect.Response[sandboxv1.GetNetworkResponse], error) {
	st, err := a.e.GetNetwork(ctx, callerOf(req.Header()), req.Msg.GetId())
	if err != nil {
		return nil, err
	}
	return connect.NewResponse(networkProtoInfo(st)), nil
}
