package errs

import (
	"errors"

	"connectrpc.com/connect"
)

// Message is what an error says to a client: a Connect error's message without its code
// (as it travels on the wire), or any other error's text.
func Message(err error) string {
	var ce *connect.Error
	if errors.As(err, &ce) {
		return ce.Message()
	}
	return err.Error()
}
