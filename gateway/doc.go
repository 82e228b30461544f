// Package gateway assembles the Loops server: one listener (HTTP/1.1 and h2c) that serves
// loops.v1 over Connect, gRPC and gRPC-Web, the same API as REST (grpc-gateway) with its
// OpenAPI document at /openapi.json, Tinker's HTTP routes under /api/v1/ (package compat),
// checkpoint archive downloads, /healthz and Prometheus /metrics. Every surface calls the
// one core (package core).
package gateway
