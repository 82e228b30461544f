package protocol

import (
	"embed"
	"fmt"
	"io/fs"
	"path"
	"regexp"
	"slices"
	"sort"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"
	"sigs.k8s.io/yaml"

	conformancev1 "github.com/loops-dev/loops/gen/go/loops/conformance/v1"
	// The loops.v1 and Tinker messages must be registered for methods and bodies to resolve.
	_ "github.com/loops-dev/loops/gen/go/loops/v1"
	_ "github.com/loops-dev/loops/gen/go/tinker/public/v1"
)

//go:embed cases/*.yaml
var embeddedCases embed.FS

// Case is one loaded case with the file it came from.
type Case struct {
	// Group is the file's base name without ".yaml".
	Group string
	*conformancev1.Case
}

// FullName is "<group>/<case>".
func (c *Case) FullName() string { return c.Group + "/" + c.GetName() }

// Capabilities a case may require.
const (
	// RequiresOtherKey: a second API key, in another workspace.
	RequiresOtherKey = "other_key"
	// RequiresBodyLimit: the server's request body limit is known.
	RequiresBodyLimit = "body_limit"
	// RequiresKeyCheck: the server refuses keys it was not given (not an open-mode server
	// such as `loops serve` without keys, which accepts any tml- key on loopback).
	RequiresKeyCheck = "key_check"
	// RequiresOperatorKey: an operator key (${operator_key}), to make API keys with.
	RequiresOperatorKey = "operator_key"
)

var (
	caseName  = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
	knownNeed = []string{RequiresOtherKey, RequiresBodyLimit, RequiresKeyCheck, RequiresOperatorKey}
)

// EmbeddedCases returns the cases shipped with Loops (conformance/protocol/cases).
func EmbeddedCases() ([]*Case, error) {
	sub, err := fs.Sub(embeddedCases, "cases")
	if err != nil {
		return nil, err
	}
	return LoadCases(sub)
}

// LoadCases reads every *.yaml file at the top of fsys, in name order, and validates it.
func LoadCases(fsys fs.FS) ([]*Case, error) {
	names, err := fs.Glob(fsys, "*.yaml")
	if err != nil {
		return nil, err
	}
	sort.Strings(names)
	var out []*Case
	seen := map[string]bool{}
	for _, name := range names {
		b, err := fs.ReadFile(fsys, name)
		if err != nil {
			return nil, err
		}
		file, err := ParseCaseFile(b)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		group := strings.TrimSuffix(path.Base(name), ".yaml")
		for _, c := range file.GetCases() {
			lc := &Case{Group: group, Case: c}
			if err := validateCase(lc); err != nil {
				return nil, fmt.Errorf("%s: case %q: %w", name, c.GetName(), err)
			}
			if seen[lc.FullName()] {
				return nil, fmt.Errorf("%s: case %q appears twice", name, c.GetName())
			}
			seen[lc.FullName()] = true
			out = append(out, lc)
		}
	}
	return out, nil
}

// ParseCaseFile decodes one YAML case file: YAML to JSON (anchors resolved), then protojson,
// which rejects unknown fields.
func ParseCaseFile(b []byte) (*conformancev1.CaseFile, error) {
	j, err := yaml.YAMLToJSON(b)
	if err != nil {
		return nil, fmt.Errorf("yaml: %w", err)
	}
	file := &conformancev1.CaseFile{}
	if err := protojson.Unmarshal(j, file); err != nil {
		return nil, fmt.Errorf("case file: %w", err)
	}
	return file, nil
}

// validateCase checks what protojson cannot: names, methods, codes and bodies.
func validateCase(c *Case) error {
	if !caseName.MatchString(c.GetName()) {
		return fmt.Errorf("name must be lower snake case")
	}
	if len(c.GetSteps()) == 0 {
		return fmt.Errorf("no steps")
	}
	for _, r := range c.GetRequires() {
		if !slices.Contains(knownNeed, r) {
			return fmt.Errorf("requires %q: known capabilities are %v", r, knownNeed)
		}
	}
	ids := map[string]bool{}
	for i, s := range c.GetSteps() {
		if s.GetCall() == nil && s.GetTinker() == nil {
			return fmt.Errorf("step %d has neither call nor tinker", i)
		}
		if s.GetId() != "" {
			if ids[s.GetId()] {
				return fmt.Errorf("step id %q appears twice", s.GetId())
			}
			ids[s.GetId()] = true
		}
		if call := s.GetCall(); call != nil {
			if _, err := findMethod(call.GetMethod()); err != nil {
				return fmt.Errorf("step %d: %w", i, err)
			}
			if call.GetRequest() != nil && call.GetRaw() != nil {
				return fmt.Errorf("step %d: call has both request and raw", i)
			}
		}
		if tc := s.GetTinker(); tc != nil {
			if !strings.HasPrefix(tc.GetPath(), "/") {
				return fmt.Errorf("step %d: tinker path %q must start with /", i, tc.GetPath())
			}
			if p := tc.GetProto(); p != nil {
				if _, err := protoregistry.GlobalTypes.FindMessageByName(protoreflect.FullName(p.GetType())); err != nil {
					return fmt.Errorf("step %d: tinker proto type %q: %w", i, p.GetType(), err)
				}
			}
		}
		if _, err := parseCode(s.GetExpect().GetGrpcCode()); err != nil {
			return fmt.Errorf("step %d: %w", i, err)
		}
	}
	return nil
}

// parseCode parses a canonical gRPC code name; "" is OK.
func parseCode(name string) (codes.Code, error) {
	if name == "" {
		return codes.OK, nil
	}
	var c codes.Code
	if err := c.UnmarshalJSON([]byte(`"` + strings.ToUpper(name) + `"`)); err != nil {
		return 0, fmt.Errorf("grpc_code %q is not a canonical gRPC code name (e.g. INVALID_ARGUMENT)", name)
	}
	return c, nil
}

// findMethod resolves "pkg.Service/Method" in the linked descriptors.
func findMethod(full string) (protoreflect.MethodDescriptor, error) {
	svc, m, ok := strings.Cut(full, "/")
	if !ok {
		return nil, fmt.Errorf("method %q: want pkg.Service/Method", full)
	}
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(svc))
	if err != nil {
		return nil, fmt.Errorf("method %q: %w", full, err)
	}
	sd, ok := d.(protoreflect.ServiceDescriptor)
	if !ok {
		return nil, fmt.Errorf("method %q: %s is not a service", full, svc)
	}
	md := sd.Methods().ByName(protoreflect.Name(m))
	if md == nil {
		return nil, fmt.Errorf("method %q: %s has no method %s", full, svc, m)
	}
	return md, nil
}

// surfacesOf is where a case can run: every surface all of its steps have a form for,
// narrowed by the case's surfaces list.
func surfacesOf(c *Case) []conformancev1.Surface {
	var out []conformancev1.Surface
	for _, s := range AllSurfaces {
		if len(c.GetSurfaces()) > 0 && !slices.Contains(c.GetSurfaces(), s) {
			continue
		}
		ok := true
		for _, st := range c.GetSteps() {
			if !stepHasForm(st, s) {
				ok = false
				break
			}
		}
		if ok {
			out = append(out, s)
		}
	}
	return out
}

func stepHasForm(st *conformancev1.Step, s conformancev1.Surface) bool {
	if s == conformancev1.Surface_SURFACE_TINKER {
		return st.GetTinker() != nil
	}
	call := st.GetCall()
	if call == nil {
		return false
	}
	raw := call.GetRaw()
	if raw == nil || raw.GetOverLimit() {
		return true
	}
	if s == conformancev1.Surface_SURFACE_REST {
		return raw.GetJson() != ""
	}
	return raw.GetProtoHex() != ""
}

// needsOf is what a case needs from the target: its requires list plus an other key when a
// step uses ${other_key}, an operator key when one uses ${operator_key}, and the body limit
// when a body is over_limit.
func needsOf(c *Case) []string {
	need := slices.Clone(c.GetRequires())
	b, _ := protojson.Marshal(c.Case)
	if strings.Contains(string(b), "${other_key}") && !slices.Contains(need, RequiresOtherKey) {
		need = append(need, RequiresOtherKey)
	}
	if strings.Contains(string(b), "${operator_key}") && !slices.Contains(need, RequiresOperatorKey) {
		need = append(need, RequiresOperatorKey)
	}
	for _, st := range c.GetSteps() {
		if (st.GetCall().GetRaw().GetOverLimit() || st.GetTinker().GetOverLimit()) && !slices.Contains(need, RequiresBodyLimit) {
			need = append(need, RequiresBodyLimit)
		}
	}
	return need
}
