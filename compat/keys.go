package compat

import (
	"net/http"
	"strconv"
	"strings"
)

// authTokenResponse is the SDK's AuthTokenResponse.
type authTokenResponse struct {
	JWT string `json:"jwt"`
}

// authToken exchanges the request's API key for a short-lived access token (the SDK's
// JwtAuthProvider, when client/config enables pjwt_auth_enabled). The body is an empty
// object.
func (s *server) authToken(w http.ResponseWriter, r *http.Request) error {
	if _, err := s.readBody(w, r); err != nil {
		return err
	}
	tok, err := s.opt.Keys.Token(r.Context())
	if err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, authTokenResponse{JWT: tok})
	return nil
}

// selfKeyResponse is the SDK CLI's SelfApiKeyResponse (tinker auth login checks a key with
// it). key_id is the number the key's id ("key-" and 16 hex digits) spells in hex; name is
// the key's name, or its id when it has none; the organization is the workspace; a key is
// no person's, so the email is empty.
type selfKeyResponse struct {
	KeyID   uint64         `json:"key_id"`
	ID      string         `json:"id"`
	Name    string         `json:"name"`
	Note    string         `json:"note"`
	Details selfKeyDetails `json:"details"`
}

type selfKeyDetails struct {
	OrgDetails struct {
		Name string `json:"name"`
	} `json:"org_details"`
	UserDetails struct {
		Email string `json:"email"`
	} `json:"user_details"`
}

// selfKey answers GET /api/v1/auth/apikey/me: the public record of the request's key.
func (s *server) selfKey(w http.ResponseWriter, r *http.Request) error {
	who, err := s.opt.Keys.Identity(r.Context())
	if err != nil {
		return err
	}
	out := selfKeyResponse{ID: who.GetKeyId(), Name: who.GetKey().GetName()}
	out.KeyID, _ = strconv.ParseUint(strings.TrimPrefix(who.GetKeyId(), "key-"), 16, 64)
	if out.Name == "" {
		out.Name = who.GetKeyId()
	}
	out.Note = "workspace " + who.GetWorkspace() + ", role " + strings.ToLower(strings.TrimPrefix(who.GetRole().String(), "KEY_ROLE_")) + ", from " + who.GetSource()
	out.Details.OrgDetails.Name = who.GetWorkspace()
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

// revokeSelfKey answers DELETE /api/v1/auth/apikey/me: it revokes the request's own key
// (tinker auth logout), which is refused from then on.
func (s *server) revokeSelfKey(w http.ResponseWriter, r *http.Request) error {
	if err := s.opt.Keys.RevokeSelf(r.Context()); err != nil {
		return err
	}
	s.edge.WriteJSON(w, http.StatusOK, map[string]any{})
	return nil
}
