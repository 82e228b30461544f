// Package gateway assembles the Loops server: one listener (HTTP/1.1 and h2c) that serves
// loops.v1 over Connect, gRPC and gRPC-Web, the same API as REST (grpc-gateway) with its
// OpenAPI document at /openapi.json, Tinker's HTTP routes under /api/v1/ (package compat),
// checkpoint archive downloads, /healthz and Prometheus /metrics. Every surface calls the
// one core (package core).
//
// With Config.Lease, the server is one of several gateways on a shared database (standby.go,
// docs/two-gateways.md): it runs the core only while it holds the leader lease (package
// lease) and otherwise forwards every route but /healthz and /metrics to the leader.
package gateway
