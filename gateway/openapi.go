package gateway

import (
	"encoding/json"
	"sync"

	"github.com/loops-dev/loops/gateway/ckhttp"
	"github.com/loops-dev/loops/gen/openapi"
)

// openAPIDocument is what GET /openapi.json serves: the OpenAPI document generated from
// proto/loops/v1, plus loops.v1's routes that are plain HTTP rather than RPCs (checkpoint
// export and import stream tar archives), so that one document lists every route.
var openAPIDocument = sync.OnceValue(func() []byte {
	var doc map[string]any
	if err := json.Unmarshal(openapi.LoopsV1, &doc); err != nil {
		panic("gateway: the generated OpenAPI document does not parse: " + err.Error())
	}
	paths, _ := doc["paths"].(map[string]any)
	if paths == nil {
		paths = map[string]any{}
		doc["paths"] = paths
	}
	for path, item := range streamRoutes() {
		paths[path] = item
	}
	b, err := json.Marshal(doc)
	if err != nil {
		panic("gateway: marshalling the OpenAPI document: " + err.Error())
	}
	return b
})

// streamRoutes describes ckhttp.ExportPath and ckhttp.ImportPath in OpenAPI 2.0 terms.
func streamRoutes() map[string]any {
	query := func(name, desc string, required bool, enum ...string) map[string]any {
		p := map[string]any{"name": name, "in": "query", "required": required, "type": "string", "description": desc}
		if len(enum) > 0 {
			p["enum"] = enum
		}
		return p
	}
	failure := map[string]any{
		"description": "An error, with what was wrong: a 4xx (a bad or missing parameter, a checkpoint not found, 408 when an import arrives slower than the minimum transfer rate, 413 over the size limit, 429 with Retry-After when the server, or the workspace's share of it, runs its most at once) or a 5xx.",
		"schema":      map[string]any{"type": "object", "properties": map[string]any{"detail": map[string]any{"type": "string"}}},
	}
	tar := map[string]any{"type": "string", "format": "binary"}
	return map[string]any{
		ckhttp.ExportPath: map[string]any{"get": map[string]any{
			"summary":     "Downloads a checkpoint as a tar archive: its PEFT adapter folder (peft), or a complete Hugging Face model folder with the adapter folded into the base weights (merged). GetCheckpointExportURL returns this URL; fetch it with the API key (docs/export-import.md).",
			"operationId": "CheckpointExports_Get",
			"produces":    []string{"application/x-tar"},
			"parameters": []any{
				query("path", "The checkpoint's tinker:// path; the workspace must own it or it must be public.", true),
				query("format", "peft or merged.", true, "peft", "merged"),
			},
			"responses": map[string]any{
				"200":     map[string]any{"description": "The exported folder as a tar stream.", "schema": tar},
				"default": failure,
			},
			"tags": []string{"CheckpointService"},
		}},
		ckhttp.ImportPath: map[string]any{"post": map[string]any{
			"summary":     "Imports a PEFT adapter trained elsewhere as a checkpoint (weights/<name> of a new training run), checked against the base model: the body is a tar of the adapter folder (adapter_config.json, adapter_model.safetensors). The answer is the new checkpoint, which samplers, deployments and training runs take like any other (docs/export-import.md).",
			"operationId": "CheckpointImports_Create",
			"consumes":    []string{"application/x-tar"},
			"parameters": []any{
				query("base_model", "The base model the adapter was trained on (GET /v1/models).", true),
				query("name", "The checkpoint's name (default \"imported\").", false),
				map[string]any{"name": "body", "in": "body", "required": true, "description": "A tar of the adapter folder.", "schema": tar},
			},
			"responses": map[string]any{
				"200":     map[string]any{"description": "The imported checkpoint.", "schema": map[string]any{"$ref": "#/definitions/v1Checkpoint"}},
				"default": failure,
			},
			"tags": []string{"CheckpointService"},
		}},
	}
}
