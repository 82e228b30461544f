// Package auth checks API keys and scopes every request to a workspace. Keys look like
// "tml-…" (the tinker SDK refuses other shapes). With keys configured, only those keys are
// accepted and each maps to its workspace. With none configured the server runs in open
// mode: it must listen on loopback only, accepts any well-formed key, and gives each distinct
// key its own workspace, so isolation still holds between keys.
package auth
