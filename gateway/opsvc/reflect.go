package opsvc

import (
	"net/http"
	"slices"
	"sync"

	"connectrpc.com/connect"
	"connectrpc.com/grpchealth"
	"connectrpc.com/grpcreflect"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	reflectionv1 "google.golang.org/grpc/reflection/grpc_reflection_v1"
	reflectionv1alpha "google.golang.org/grpc/reflection/grpc_reflection_v1alpha"
	"google.golang.org/protobuf/reflect/protoreflect"
	"google.golang.org/protobuf/reflect/protoregistry"

	// The loops.v1 descriptors that reflection serves.
	_ "github.com/loops-dev/loops/gen/go/loops/v1"
)

// PublicPackage is the protobuf package whose services reflection lists: the loops.v1
// API, which /openapi.json already publishes in full (proto/loops/v1).
const PublicPackage = "loops.v1"

// LoopsServices returns the fully-qualified names of the loops.v1 services, sorted: every
// service in proto/loops/v1, which the gateway serves on its public port (PoolService to
// operator keys only).
var LoopsServices = sync.OnceValue(func() []string {
	var names []string
	protoregistry.GlobalFiles.RangeFilesByPackage(PublicPackage, func(fd protoreflect.FileDescriptor) bool {
		for i := range fd.Services().Len() {
			names = append(names, string(fd.Services().Get(i).FullName()))
		}
		return true
	})
	slices.Sort(names)
	return names
})

// reflectedServices are what reflection lists: the loops.v1 services, the health service
// and reflection itself (as grpc-go servers list them).
func reflectedServices() []string {
	return append(append([]string(nil), LoopsServices()...),
		grpchealth.HealthV1ServiceName, grpcreflect.ReflectV1ServiceName, grpcreflect.ReflectV1AlphaServiceName)
}

// publicFiles is the descriptor set reflection may reveal: the files that declare the
// listed services, and their imports (google/api's HTTP annotations and the well-known
// types), nothing else that the binary happens to link in (the workers' loops.backend.v1,
// the conformance protos, …). It is what /openapi.json publishes, in protobuf's terms.
type publicFiles struct {
	paths map[string]bool
}

func newPublicFiles(services []string) *publicFiles {
	p := &publicFiles{paths: map[string]bool{}}
	var add func(fd protoreflect.FileDescriptor)
	add = func(fd protoreflect.FileDescriptor) {
		if p.paths[fd.Path()] {
			return
		}
		p.paths[fd.Path()] = true
		for i := range fd.Imports().Len() {
			add(fd.Imports().Get(i).FileDescriptor)
		}
	}
	for _, s := range services {
		if d, err := protoregistry.GlobalFiles.FindDescriptorByName(protoreflect.FullName(s)); err == nil {
			add(d.ParentFile())
		}
	}
	return p
}

// FindFileByPath implements protodesc.Resolver.
func (p *publicFiles) FindFileByPath(path string) (protoreflect.FileDescriptor, error) {
	if !p.paths[path] {
		return nil, protoregistry.NotFound
	}
	return protoregistry.GlobalFiles.FindFileByPath(path)
}

// FindDescriptorByName implements protodesc.Resolver.
func (p *publicFiles) FindDescriptorByName(name protoreflect.FullName) (protoreflect.Descriptor, error) {
	d, err := protoregistry.GlobalFiles.FindDescriptorByName(name)
	if err != nil {
		return nil, err
	}
	if !p.public(d.ParentFile()) {
		return nil, protoregistry.NotFound
	}
	return d, nil
}

func (p *publicFiles) public(fd protoreflect.FileDescriptor) bool {
	return fd != nil && p.paths[fd.Path()]
}

// publicExtensions are the extensions declared in the public files.
type publicExtensions struct{ files *publicFiles }

// FindExtensionByName implements grpcreflect.ExtensionResolver.
func (e publicExtensions) FindExtensionByName(field protoreflect.FullName) (protoreflect.ExtensionType, error) {
	x, err := protoregistry.GlobalTypes.FindExtensionByName(field)
	if err != nil {
		return nil, err
	}
	if !e.files.public(x.TypeDescriptor().ParentFile()) {
		return nil, protoregistry.NotFound
	}
	return x, nil
}

// FindExtensionByNumber implements grpcreflect.ExtensionResolver.
func (e publicExtensions) FindExtensionByNumber(message protoreflect.FullName, field protoreflect.FieldNumber) (protoreflect.ExtensionType, error) {
	x, err := protoregistry.GlobalTypes.FindExtensionByNumber(message, field)
	if err != nil {
		return nil, err
	}
	if !e.files.public(x.TypeDescriptor().ParentFile()) {
		return nil, protoregistry.NotFound
	}
	return x, nil
}

// RangeExtensionsByMessage implements grpcreflect.ExtensionResolver.
func (e publicExtensions) RangeExtensionsByMessage(message protoreflect.FullName, f func(protoreflect.ExtensionType) bool) {
	protoregistry.GlobalTypes.RangeExtensionsByMessage(message, func(x protoreflect.ExtensionType) bool {
		if !e.files.public(x.TypeDescriptor().ParentFile()) {
			return true
		}
		return f(x)
	})
}

// The descriptors of the health and reflection services as grpc-go registers them, so
// that reflection describes them under their own names.
var (
	_ = healthpb.File_grpc_health_v1_health_proto
	_ = reflectionv1.File_grpc_reflection_v1_reflection_proto
	_ = reflectionv1alpha.File_grpc_reflection_v1alpha_reflection_proto
)

// reflectionHandlers returns the v1 and v1alpha reflection services, over the public
// descriptors only.
func reflectionHandlers() map[string]http.Handler {
	names := reflectedServices()
	files := newPublicFiles(names)
	r := grpcreflect.NewReflector(grpcreflect.NamerFunc(func() []string { return names }),
		grpcreflect.WithDescriptorResolver(files),
		grpcreflect.WithExtensionResolver(publicExtensions{files}))
	opts := []connect.HandlerOption{connect.WithReadMaxBytes(maxMessageBytes)}
	v1Path, v1 := grpcreflect.NewHandlerV1(r, opts...)
	alphaPath, alpha := grpcreflect.NewHandlerV1Alpha(r, opts...)
	return map[string]http.Handler{v1Path: v1, alphaPath: alpha}
}
