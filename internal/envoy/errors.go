package envoy

import (
	"errors"
	"fmt"
)

var (
	// ErrUnreachable is wrapped by every error that means Envoy's admin API
	// did not answer: the dial failed, the connection was reset or cut, or
	// no answer came within the call's timeout.
	ErrUnreachable = errors.New("envoy admin unreachable")

	// ErrStatAbsent means the stat asked for is not in Envoy's answer. With
	// usedonly, Envoy hides stats that never changed, so absent is not zero.
	ErrStatAbsent = errors.New("stat not present")

	// ErrMalformed means an answer could not be parsed.
	ErrMalformed = errors.New("malformed answer")
)

// maxErrorBody is how much of an unexpected answer a StatusError keeps.
const maxErrorBody = 512

// StatusError is an answer with a status code the call did not expect.
type StatusError struct {
	Method string // "GET" or "POST"
	Path   string // "/stats"
	Code   int    // HTTP status code
	Body   string // the body, truncated to 512 bytes
}

func (e *StatusError) Error() string {
	return fmt.Sprintf("envoy admin: %s %s: status %d: %q", e.Method, e.Path, e.Code, e.Body)
}

// UnreachableError says which call found Envoy unreachable and why. It
// matches [ErrUnreachable] with errors.Is and also unwraps to its cause.
type UnreachableError struct {
	Method string
	Path   string
	Err    error // the cause: a dial error, a reset, context.DeadlineExceeded...
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("envoy admin unreachable: %s %s: %v", e.Method, e.Path, e.Err)
}

// Unwrap returns both ErrUnreachable and the cause.
func (e *UnreachableError) Unwrap() []error { return []error{ErrUnreachable, e.Err} }

func truncate(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}
