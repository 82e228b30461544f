// Package protocol runs the protocol conformance cases: YAML files, each a
// loops.conformance.v1.CaseFile, whose cases state a request once and the answer every
// surface must give. The runner derives each surface's call from the case: Connect and gRPC
// from the loops.v1 method and message, REST from the method's google.api.http annotation
// (read from the generated descriptors), and the Tinker HTTP routes from the case's own
// Tinker request.
//
// Run is the entry point for Go tests (one subtest per case and surface, named
// "<file>/<case>/<surface>"); Execute is the same without a testing.T, for `loops
// conformance`. Cases expected to fail on an implementation are listed in a known-failing
// file of globs, each with a reason; a listed case that passes is reported, so the list only
// shrinks.
package protocol
