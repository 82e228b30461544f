package access

import (
	"errors"
	"fmt"
	"unicode"
	"unicode/utf8"

	"connectrpc.com/connect"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Bounds of a request's fields.
const (
	// MaxReasonBytes bounds a request's or decision's reason.
	MaxReasonBytes = 1024
	// MaxModelBytes bounds a model name.
	MaxModelBytes = 256
	// MaxRuns is the most training runs at once a grant may give.
	MaxRuns = 1000
	// MaxGrantSeconds is the longest expiring grant: a year (0 is "no expiry").
	MaxGrantSeconds = 366 * 24 * 3600
)

// ValidateAmounts checks what a request asks for (or a grant gives), before any catalog
// check: a model name, and amounts that are 0 (nothing of that kind) or positive.
func ValidateAmounts(a *loopsv1.AccessAmounts) error {
	if a == nil || a.GetModel() == "" {
		return invalid("amounts.model is required: the base model you need (loops models lists them)")
	}
	if err := text("amounts.model", a.GetModel(), MaxModelBytes); err != nil {
		return err
	}
	for _, f := range []struct {
		name string
		v    int32
	}{
		{"max_sequence_length", a.GetMaxSequenceLength()},
		{"max_lora_rank", a.GetMaxLoraRank()},
		{"max_concurrent_runs", a.GetMaxConcurrentRuns()},
	} {
		if f.v < 0 {
			return invalid(fmt.Sprintf("amounts.%s is %d: use a positive number, or 0 to ask for none", f.name, f.v))
		}
	}
	if a.GetMaxConcurrentRuns() > MaxRuns {
		return invalid(fmt.Sprintf("amounts.max_concurrent_runs is %d, over the most a grant gives, %d", a.GetMaxConcurrentRuns(), MaxRuns))
	}
	return nil
}

// ValidateReason checks a reason: at most MaxReasonBytes of printable UTF-8; required
// makes an empty one an error.
func ValidateReason(reason string, required bool) error {
	if reason == "" && required {
		return invalid(`reason is required: say why (--reason "...")`)
	}
	return text("reason", reason, MaxReasonBytes)
}

// ValidateRequest checks a RequestAccess call's fields.
func ValidateRequest(m *loopsv1.RequestAccessRequest) error {
	if err := ValidateAmounts(m.GetAmounts()); err != nil {
		return err
	}
	return ValidateReason(m.GetReason(), true)
}

// ValidateGrant checks a GrantAccessRequest call's own fields (the amounts, when set, are
// checked against the request and the catalog by the service).
func ValidateGrant(m *loopsv1.GrantAccessRequestRequest) error {
	if m.GetId() == "" {
		return invalid("id is required: the access request's id (acr-…; loops access list shows them)")
	}
	if err := text("id", m.GetId(), 64); err != nil {
		return err
	}
	if m.GetAmounts() != nil {
		if err := ValidateAmounts(m.GetAmounts()); err != nil {
			return err
		}
	}
	if d := m.GetDurationSeconds(); d < 0 || d > MaxGrantSeconds {
		return invalid(fmt.Sprintf("duration_seconds is %d: use 0 (no expiry) or 1 to %d", d, MaxGrantSeconds))
	}
	return ValidateReason(m.GetReason(), false)
}

func text(field, s string, max int) error {
	if len(s) > max {
		return invalid(fmt.Sprintf("%s is %d bytes, over the limit of %d", field, len(s), max))
	}
	if !utf8.ValidString(s) {
		return invalid(field + " is not valid UTF-8")
	}
	for _, r := range s {
		if unicode.IsControl(r) && r != '\n' && r != '\t' {
			return invalid(fmt.Sprintf("%s has a control character (%U)", field, r))
		}
	}
	return nil
}

func invalid(msg string) error { return connect.NewError(connect.CodeInvalidArgument, errors.New(msg)) }
