package audit

import (
	"time"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
)

// unclassified is the event of a write no rule matched.
const unclassified = "unclassified_call"

func storeEvent(at time.Time, c auth.Caller, surface, action string, rule Rule, target string, status int, code string) store.AuditEvent {
	return store.AuditEvent{
		Time: at.UTC(), KeyID: c.KeyID, ClientAddr: c.Addr, Surface: surface, Action: action,
		Event: rule.Event, Resource: rule.Resource(), Target: target, Status: status, Code: code,
	}
}
