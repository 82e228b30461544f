// Package catalog is what the compatible routes say of a served model beside their own
// fields: Loops' catalog entry (loops.v1 ModelInfo) as JSON, shared by the Tinker route
// get_server_capabilities and the OpenAI route GET /models, so that both say the same.
package catalog
