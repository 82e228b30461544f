package protocol

import (
	"bytes"
	"context"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"regexp"
	"strings"

	"connectrpc.com/connect"
	"google.golang.org/genproto/googleapis/api/annotations"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/mem"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	conformancev1 "github.com/loops-dev/loops/gen/go/loops/conformance/v1"
)

// rawMsg carries encoded bytes through the Connect and gRPC clients, so that one code path
// sends both well-formed and deliberately malformed messages.
type rawMsg struct{ b []byte }

// connectRawCodec is a Connect codec named "proto" that passes bytes through.
type connectRawCodec struct{}

func (connectRawCodec) Name() string { return "proto" }

func (connectRawCodec) Marshal(v any) ([]byte, error) { return v.(*rawMsg).b, nil }

func (connectRawCodec) Unmarshal(b []byte, v any) error {
	v.(*rawMsg).b = append([]byte(nil), b...)
	return nil
}

// grpcRawCodec is the same for grpc-go.
type grpcRawCodec struct{}

func (grpcRawCodec) Name() string { return "proto" }

func (grpcRawCodec) Marshal(v any) (mem.BufferSlice, error) {
	return mem.BufferSlice{mem.SliceBuffer(v.(*rawMsg).b)}, nil
}

func (grpcRawCodec) Unmarshal(data mem.BufferSlice, v any) error {
	v.(*rawMsg).b = data.Materialize()
	return nil
}

// callResult is what a loops.v1 call answered on one surface.
type callResult struct {
	code    codes.Code
	status  int // HTTP status (REST only)
	message string
	out     proto.Message // the decoded response when code is OK
}

// loopsCall is one loops.v1 request, ready to send.
type loopsCall struct {
	method protoreflect.MethodDescriptor
	// req is the request message (nil when only a raw body is sent).
	req proto.Message
	raw *conformancev1.RawBody
	// key is the API key; "" sends none.
	key string
}

// invokeLoops sends c over a loops.v1 surface. The error is a transport failure; an error
// status is in the result.
func (r *runner) invokeLoops(ctx context.Context, s conformancev1.Surface, c loopsCall) (*callResult, error) {
	switch s {
	case conformancev1.Surface_SURFACE_REST:
		return r.invokeREST(ctx, c)
	case conformancev1.Surface_SURFACE_CONNECT, conformancev1.Surface_SURFACE_GRPC:
	default:
		return nil, fmt.Errorf("surface %v is not a loops.v1 surface", s)
	}
	body, err := r.protoBody(c)
	if err != nil {
		return nil, err
	}
	procedure := "/" + string(c.method.Parent().FullName()) + "/" + string(c.method.Name())
	resp := &rawMsg{}
	res := &callResult{}
	if s == conformancev1.Surface_SURFACE_CONNECT {
		client := connect.NewClient[rawMsg, rawMsg](r.http, r.base+procedure, connect.WithCodec(connectRawCodec{}))
		req := connect.NewRequest(&rawMsg{b: body})
		if c.key != "" {
			req.Header().Set("X-API-Key", c.key)
		}
		out, err := client.CallUnary(ctx, req)
		if err != nil {
			res.code, res.message = codes.Code(connect.CodeOf(err)), err.Error()
			var ce *connect.Error
			if errors.As(err, &ce) {
				res.message = ce.Message()
			}
		} else {
			resp = out.Msg
		}
	} else {
		if c.key != "" {
			ctx = metadata.AppendToOutgoingContext(ctx, "x-api-key", c.key)
		}
		err := r.grpc.Invoke(ctx, procedure, &rawMsg{b: body}, resp, grpc.ForceCodecV2(grpcRawCodec{}))
		if err != nil {
			st := status.Convert(err)
			res.code, res.message = st.Code(), st.Message()
		}
	}
	if res.code != codes.OK {
		return res, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(c.method.Output().FullName())
	if err != nil {
		return nil, err
	}
	res.out = mt.New().Interface()
	if err := proto.Unmarshal(resp.b, res.out); err != nil {
		return nil, fmt.Errorf("the response is not a valid %s: %w", c.method.Output().FullName(), err)
	}
	return res, nil
}

// protoBody is the binary body for Connect and gRPC.
func (r *runner) protoBody(c loopsCall) ([]byte, error) {
	switch {
	case c.raw.GetOverLimit():
		return bytes.Repeat([]byte{'a'}, int(r.opts.MaxBodyBytes)+1), nil
	case c.raw.GetProtoHex() != "":
		return hex.DecodeString(strings.Join(strings.Fields(c.raw.GetProtoHex()), ""))
	case c.req != nil:
		return proto.Marshal(c.req)
	}
	return nil, nil
}

var pathVar = regexp.MustCompile(`\{([^}=]+)(=[^}]*)?\}`)

// invokeREST sends c as the REST call its google.api.http annotation describes: path
// variables from the message, the rest as the JSON body (body "*") or the query string.
func (r *runner) invokeREST(ctx context.Context, c loopsCall) (*callResult, error) {
	rule, ok := proto.GetExtension(c.method.Options(), annotations.E_Http).(*annotations.HttpRule)
	if !ok || rule == nil {
		return nil, fmt.Errorf("%s has no google.api.http annotation", c.method.FullName())
	}
	var verb, tmpl string
	switch p := rule.GetPattern().(type) {
	case *annotations.HttpRule_Get:
		verb, tmpl = http.MethodGet, p.Get
	case *annotations.HttpRule_Post:
		verb, tmpl = http.MethodPost, p.Post
	case *annotations.HttpRule_Put:
		verb, tmpl = http.MethodPut, p.Put
	case *annotations.HttpRule_Delete:
		verb, tmpl = http.MethodDelete, p.Delete
	case *annotations.HttpRule_Patch:
		verb, tmpl = http.MethodPatch, p.Patch
	default:
		return nil, fmt.Errorf("%s: unsupported http rule", c.method.FullName())
	}
	var msg protoreflect.Message
	if c.req != nil {
		msg = c.req.ProtoReflect()
	} else {
		msg = emptyMessage(c.method.Input())
	}
	used := map[string]bool{}
	var pathErr error
	p := pathVar.ReplaceAllStringFunc(tmpl, func(m string) string {
		name := pathVar.FindStringSubmatch(m)[1]
		used[name] = true
		v, err := fieldText(msg, name)
		if err != nil && pathErr == nil {
			pathErr = err
		}
		return url.PathEscape(v)
	})
	if pathErr != nil {
		return nil, pathErr
	}
	var body io.Reader
	switch {
	case c.raw.GetOverLimit():
		body = bytes.NewReader(overLimitJSON(r.opts.MaxBodyBytes))
	case c.raw.GetJson() != "":
		body = strings.NewReader(c.raw.GetJson())
	case rule.GetBody() == "*":
		b, err := protojson.MarshalOptions{UseProtoNames: true}.Marshal(msg.Interface())
		if err != nil {
			return nil, err
		}
		body = bytes.NewReader(b)
	case rule.GetBody() == "":
		q := url.Values{}
		addQuery(q, "", msg, used)
		if len(q) > 0 {
			p += "?" + q.Encode()
		}
	default:
		return nil, fmt.Errorf("%s: body %q is not supported by the runner", c.method.FullName(), rule.GetBody())
	}
	req, err := http.NewRequestWithContext(ctx, verb, r.base+p, body)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.key != "" {
		req.Header.Set("X-API-Key", c.key)
	}
	resp, err := r.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	res := &callResult{status: resp.StatusCode}
	if resp.StatusCode/100 != 2 {
		var e struct {
			Code    codes.Code `json:"code"`
			Message string     `json:"message"`
		}
		if json.Unmarshal(b, &e) == nil && e.Message != "" {
			res.code, res.message = e.Code, e.Message
		} else {
			res.code, res.message = codes.Unknown, strings.TrimSpace(string(b))
		}
		if res.code == codes.OK {
			res.code = codes.Unknown
		}
		return res, nil
	}
	mt, err := protoregistry.GlobalTypes.FindMessageByName(c.method.Output().FullName())
	if err != nil {
		return nil, err
	}
	res.out = mt.New().Interface()
	if err := protojson.Unmarshal(b, res.out); err != nil {
		return nil, fmt.Errorf("REST %s %s answered %d with a body that is not a %s: %w", verb, p, resp.StatusCode, c.method.Output().FullName(), err)
	}
	return res, nil
}

func emptyMessage(d protoreflect.MessageDescriptor) protoreflect.Message {
	mt, err := protoregistry.GlobalTypes.FindMessageByName(d.FullName())
	if err != nil {
		panic(err)
	}
	return mt.New()
}

// fieldText reads a (dotted) scalar field as path text.
func fieldText(m protoreflect.Message, name string) (string, error) {
	parts := strings.Split(name, ".")
	for i, part := range parts {
		fd := m.Descriptor().Fields().ByName(protoreflect.Name(part))
		if fd == nil {
			return "", fmt.Errorf("path variable %q: %s has no field %s", name, m.Descriptor().FullName(), part)
		}
		if i < len(parts)-1 {
			m = m.Get(fd).Message()
			continue
		}
		return scalarText(fd, m.Get(fd)), nil
	}
	return "", nil
}

func scalarText(fd protoreflect.FieldDescriptor, v protoreflect.Value) string {
	if fd.Kind() == protoreflect.EnumKind {
		if ev := fd.Enum().Values().ByNumber(v.Enum()); ev != nil {
			return string(ev.Name())
		}
	}
	return v.String()
}

// addQuery encodes the set fields of m (except path variables) as query parameters, nested
// messages with dotted names, as grpc-gateway reads them.
func addQuery(q url.Values, prefix string, m protoreflect.Message, skip map[string]bool) {
	m.Range(func(fd protoreflect.FieldDescriptor, v protoreflect.Value) bool {
		name := prefix + string(fd.Name())
		if skip[name] {
			return true
		}
		switch {
		case fd.IsList():
			l := v.List()
			for i := range l.Len() {
				q.Add(name, scalarText(fd, l.Get(i)))
			}
		case fd.IsMap():
			// Not used by loops.v1 GET requests.
		case fd.Kind() == protoreflect.MessageKind:
			addQuery(q, name+".", v.Message(), skip)
		default:
			q.Set(name, scalarText(fd, v))
		}
		return true
	})
}

// overLimitJSON is a JSON object of exactly limit+1 bytes.
func overLimitJSON(limit int64) []byte {
	const head, tail = `{"pad":"`, `"}`
	n := int(limit) + 1 - len(head) - len(tail)
	if n < 0 {
		n = 0
	}
	return []byte(head + strings.Repeat("a", n) + tail)
}
