// Package access serves loops.v1 AccessService: access requests a member files when the
// workspace policy (gateway/policy) stops it, and the grants and denials of its workspace's
// admins (docs/access.md).
//
// A request names a base model and what it needs on it (the model itself, a sequence
// length, a LoRA rank, training runs at once) and a reason; one request per key and model
// is pending at a time (a second updates it), and a workspace holds at most
// Options.MaxPending pending ones. An admin of the workspace (a stored admin key) or an
// operator grants it, possibly with other amounts and an expiry, or denies it with a reason.
// A grant is refused with the maximum when the catalog cannot serve it. A decision is one
// store transaction: the request's new state, with the workspace's effective limits on the
// model before and after, an audit event (workspace_policy_change) and the webhook event;
// the Enforcer is then given the grants in force. A grant that expires stops applying at
// its expiry (the Enforcer checks the time) and the sweep records it as expired (with its
// audit event, workspace_policy_revert), from the store, so it survives a restart.
//
// The webhook (an operator's setting, never a tenant's) gets every request and decision as
// a JSON body signed with HMAC-SHA256 (X-Loops-Signature: sha256=<hex>), with its event id
// in X-Loops-Event-Id; deliveries are rows of the store, retried with exponential backoff
// until a 2xx, so neither a receiver's nor the gateway's restart loses one (at least once:
// receivers dedupe on the id). The queue is bounded: an event over the bound is recorded as
// failed. Admins list their workspace's deliveries, failures included.
package access
