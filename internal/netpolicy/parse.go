package netpolicy

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
)

// MaxFlagBytes bounds a --network value.
const MaxFlagBytes = 64 << 10

// NetworkFlag is a parsed --network value: a Spec, or the path of a JSON
// policy document (policy=FILE.json) for the CLI to read and give to
// ParsePolicyJSON.
type NetworkFlag struct {
	Spec Spec
	File string
}

// ParseNetworkFlag parses the CLI's --network value. The grammar:
//
//	value   = "none" | "open" | "policy=" PATH | [ "open," ] clauses
//	clauses = clause { "," clause }
//	clause  = ( "allow=" | "deny=" ) target { "," target }
//
// A target (see ParseTarget) never holds "," or "=", so the value splits
// on commas without ambiguity; a target without "allow=" or "deny=" before
// it takes the action of the one before it. So
// "allow=pypi,github,deny=npm" allows pypi and github and denies npm, and
// "open,deny=*.example.com" is open egress but example.com's subdomains.
func ParseNetworkFlag(s string) (NetworkFlag, error) {
	if len(s) > MaxFlagBytes {
		return NetworkFlag{}, invalid("--network is longer than %d bytes: put the rules in a file and use policy=FILE.json", MaxFlagBytes)
	}
	switch {
	case s == "none":
		return NetworkFlag{Spec: Spec{Mode: ModeNone}}, nil
	case s == "open":
		return NetworkFlag{Spec: Spec{Mode: ModeOpen}}, nil
	case strings.HasPrefix(s, "policy="):
		f := strings.TrimPrefix(s, "policy=")
		if f == "" {
			return NetworkFlag{}, invalid("--network policy= needs a file: policy=FILE.json")
		}
		return NetworkFlag{File: f}, nil
	case s == "":
		return NetworkFlag{}, invalid("--network is empty: use none, open, allow=SERVICE,... or policy=FILE.json")
	}
	spec := Spec{Mode: ModeRules}
	rest := s
	if r, ok := strings.CutPrefix(s, "open,"); ok {
		spec.Mode, rest = ModeOpen, r
	}
	var action Action
	for i, tok := range strings.Split(rest, ",") {
		if tok == string(Allow) || tok == string(Deny) {
			return NetworkFlag{}, invalid("--network %q: write %s=TARGET", tok, tok)
		}
		if k, v, ok := strings.Cut(tok, "="); ok {
			switch Action(k) {
			case Allow, Deny:
				action, tok = Action(k), v
			default:
				return NetworkFlag{}, invalid("--network %.40q: want allow=TARGET or deny=TARGET", tok)
			}
		} else if action == "" {
			return NetworkFlag{}, invalid("--network %.40q: start the rules with allow= or deny= (or use none, open, policy=FILE.json)", tok)
		}
		if len(spec.Rules) >= MaxRules {
			return NetworkFlag{}, invalid("--network: more than %d rules: put them in a file and use policy=FILE.json", MaxRules)
		}
		r, err := ParseTarget(action, tok)
		if err != nil {
			return NetworkFlag{}, tokenError(i, action, tok, err)
		}
		spec.Rules = append(spec.Rules, r)
	}
	spec, err := spec.Normalize()
	if err != nil {
		return NetworkFlag{}, err
	}
	return NetworkFlag{Spec: spec}, nil
}

// tokenError names rule i (0-based) by the target as written, for a
// target that did not parse.
func tokenError(i int, action Action, tok string, err error) error {
	return fmt.Errorf("network rule %d (%s %s): %w", i+1, action, strconv.QuoteToASCII(clip(tok, 80)), err)
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "..."
	}
	return s
}

// FormatNetworkFlag writes spec as a --network value that ParseNetworkFlag
// reads back to the same Spec.
func FormatNetworkFlag(spec Spec) string {
	if len(spec.Rules) == 0 {
		if spec.Mode == ModeOpen {
			return "open"
		}
		return "none"
	}
	var b strings.Builder
	if spec.Mode == ModeOpen {
		b.WriteString("open,")
	}
	for i, r := range spec.Rules {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(string(r.Action))
		b.WriteByte('=')
		b.WriteString(r.flagTarget())
	}
	return b.String()
}

// The JSON policy document (--network policy=FILE.json, the API):
//
//	{"version": 1, "mode": "rules", "rules": [
//	  {"action": "allow", "service": "pypi"},
//	  {"action": "deny", "domain": "*.example.com", "ports": [443, "8000-8100"]},
//	  {"action": "allow", "cidr": "192.0.2.0/24", "ports": [5000], "protocol": "udp"}]}
//
// version is optional and 1; mode is optional (rules when there are rules,
// none otherwise); unknown fields and repeated keys are errors.
type jsonDoc struct {
	Version *int       `json:"version,omitempty"`
	Mode    Mode       `json:"mode,omitempty"`
	Rules   []jsonRule `json:"rules,omitempty"`
}

type jsonRule struct {
	Action   Action            `json:"action"`
	Service  string            `json:"service,omitempty"`
	Domain   string            `json:"domain,omitempty"`
	CIDR     string            `json:"cidr,omitempty"`
	Ports    []json.RawMessage `json:"ports,omitempty"`
	Protocol Protocol          `json:"protocol,omitempty"`
}

// ParsePolicyJSON parses a JSON policy document.
func ParsePolicyJSON(data []byte) (Spec, error) {
	if err := checkJSON(data, "network policy"); err != nil {
		return Spec{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var doc jsonDoc
	if err := dec.Decode(&doc); err != nil {
		return Spec{}, invalid("network policy: %s", jsonProblem(err))
	}
	if doc.Version != nil && *doc.Version != 1 {
		return Spec{}, invalid("network policy version %d: this dsec reads version 1", *doc.Version)
	}
	if len(doc.Rules) > MaxRules {
		return Spec{}, invalid("%d network rules: at most %d", len(doc.Rules), MaxRules)
	}
	spec := Spec{Mode: doc.Mode}
	for i, jr := range doc.Rules {
		r := Rule{Action: jr.Action, Service: jr.Service, Domain: jr.Domain, Protocol: jr.Protocol}
		if jr.CIDR != "" {
			p, err := parseCIDR(jr.CIDR)
			if err != nil {
				return Spec{}, tokenError(i, r.Action, jr.CIDR, err)
			}
			r.CIDR = p
		}
		if len(jr.Ports) > MaxPorts {
			return Spec{}, ruleError(i, r, invalid("%d port ranges: at most %d", len(jr.Ports), MaxPorts))
		}
		for _, raw := range jr.Ports {
			pr, err := jsonPort(raw)
			if err != nil {
				return Spec{}, ruleError(i, r, err)
			}
			r.Ports = append(r.Ports, pr)
		}
		spec.Rules = append(spec.Rules, r)
	}
	return spec.Normalize()
}

// jsonPort reads 443 or "8000-8100".
func jsonPort(raw json.RawMessage) (PortRange, error) {
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return ParsePortRange(s)
	}
	t := strings.TrimSpace(string(raw))
	if strings.Trim(t, "0123456789") != "" {
		return PortRange{}, invalid("port %.20s: want a number from 1 to 65535 or \"LOW-HIGH\"", t)
	}
	pr, err := ParsePortRange(t)
	if err != nil {
		return PortRange{}, err
	}
	return pr, nil
}

// MarshalPolicyJSON writes spec as a JSON policy document that
// ParsePolicyJSON reads back to the same Spec.
func MarshalPolicyJSON(spec Spec) []byte {
	one := 1
	doc := jsonDoc{Version: &one, Mode: spec.Mode}
	for _, r := range spec.Rules {
		jr := jsonRule{Action: r.Action, Service: r.Service, Domain: r.Domain, Protocol: r.Protocol}
		if r.CIDR.IsValid() {
			jr.CIDR = r.CIDR.String()
		}
		for _, p := range r.Ports {
			if p.From == p.To {
				jr.Ports = append(jr.Ports, json.RawMessage(strconv.Itoa(int(p.From))))
			} else {
				jr.Ports = append(jr.Ports, json.RawMessage(strconv.Quote(p.String())))
			}
		}
		doc.Rules = append(doc.Rules, jr)
	}
	b, _ := json.Marshal(doc) // only strings, numbers and raw numbers
	return b
}

// ParseServiceMap parses the Python SDK's network_rules, a JSON object of
// targets (normally service names) to booleans: {"pypi": true, "npm":
// false} allows pypi and denies npm, in the order written. An empty object
// is mode none.
func ParseServiceMap(data []byte) (Spec, error) {
	if err := checkJSON(data, "network_rules"); err != nil {
		return Spec{}, err
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return Spec{}, invalid(`network_rules: want an object of service names to true or false, e.g. {"pypi": true, "npm": false}`)
	}
	var spec Spec
	for i := 0; dec.More(); i++ {
		t, _ := dec.Token() // checkJSON saw a well-formed object
		key, _ := t.(string)
		var allow any
		if err := dec.Decode(&allow); err != nil {
			return Spec{}, invalid("network_rules: %s", jsonProblem(err))
		}
		b, ok := allow.(bool)
		if !ok {
			return Spec{}, invalid("network_rules[%.80q]: want true (allow) or false (deny)", key)
		}
		action := Deny
		if b {
			action = Allow
		}
		if i >= MaxRules {
			return Spec{}, invalid("network_rules: more than %d entries", MaxRules)
		}
		r, err := ParseTarget(action, key)
		if err != nil {
			return Spec{}, tokenError(i, action, key, err)
		}
		spec.Rules = append(spec.Rules, r)
	}
	return spec.Normalize()
}

// checkJSON checks that data is one JSON value of bounded size and depth
// without a key repeated in an object (encoding/json would keep the last
// silently, so two readers could disagree on what a policy says).
func checkJSON(data []byte, what string) error {
	if len(data) > MaxDocBytes {
		return invalid("%s is larger than %d bytes", what, MaxDocBytes)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	type frame struct {
		obj  bool
		keys map[string]bool
		key  bool // the next string token of an object is a key
	}
	var stack []*frame
	for first := true; ; first = false {
		t, err := dec.Token()
		switch {
		case errors.Is(err, io.EOF) && first:
			return invalid("%s is empty", what)
		case errors.Is(err, io.EOF):
			return invalid("%s is not valid JSON: it ends early", what)
		case err != nil:
			return invalid("%s is not valid JSON: %s", what, jsonProblem(err))
		}
		var top *frame
		if len(stack) > 0 {
			top = stack[len(stack)-1]
		}
		if top != nil && top.obj && top.key && t != json.Delim('}') {
			k, _ := t.(string)
			if top.keys[k] {
				return invalid("%s: key %.80q is given twice", what, k)
			}
			top.keys[k] = true
			top.key = false
			continue
		}
		if top != nil && top.obj {
			top.key = true // the value is read: a key comes next
		}
		switch t {
		case json.Delim('{'):
			stack = append(stack, &frame{obj: true, keys: map[string]bool{}, key: true})
		case json.Delim('['):
			stack = append(stack, &frame{})
		case json.Delim('}'), json.Delim(']'):
			stack = stack[:len(stack)-1]
		}
		if len(stack) > 32 {
			return invalid("%s is nested deeper than 32", what)
		}
		if len(stack) == 0 {
			if _, err := dec.Token(); !errors.Is(err, io.EOF) {
				return invalid("%s: more than one JSON value", what)
			}
			return nil
		}
	}
}

// article returns "a string", "an array".
func article(kind string) string {
	if kind != "" && strings.ContainsRune("aeiou", rune(kind[0])) {
		return "an " + kind
	}
	return "a " + kind
}

// jsonProblem returns encoding/json's words on the user's document: its
// own text about the JSON, with no host path in it.
func jsonProblem(e error) string {
	var te *json.UnmarshalTypeError
	if errors.As(e, &te) {
		if te.Field == "" {
			return article(te.Value) + " is not allowed at the top: want an object"
		}
		return "field " + strconv.QuoteToASCII(clip(te.Field, 80)) + ": " + article(te.Value) + " is not allowed there"
	}
	var se *json.SyntaxError
	if errors.As(e, &se) {
		return se.Error() + " at byte " + strconv.FormatInt(se.Offset, 10)
	}
	return clip(strings.TrimPrefix(e.Error(), "json: "), 200)
}
