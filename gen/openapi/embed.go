// Package openapi embeds the OpenAPI (Swagger 2.0) document generated from proto/loops/v1.
package openapi

import _ "embed"

// LoopsV1 is the OpenAPI document of the loops.v1 REST API.
//
//go:embed loops.swagger.json
var LoopsV1 []byte
