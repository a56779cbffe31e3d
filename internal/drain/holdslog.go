package drain

import "time"

// HoldsRelogAfter is how long a set of hold kinds already logged stays
// unlogged when it comes back. A keep-alive client's requests can flip
// envoy-active on and off ten times a second for as long as the app
// runs; each distinct set is still logged the first time it holds.
const HoldsRelogAfter = 5 * time.Second

// holdsLog decides which changes of the gate's hold kinds are logged.
// The zero value is ready; one per drain.
type holdsLog struct {
	// logged is when each set of kinds (Verdict.Kinds) was last logged.
	logged map[uint32]time.Time
	// unlogged counts the changes left out since the last logged one.
	unlogged int
}

// change is called when the kinds change to kinds at now. It says whether
// to log the change and, if so, how many changes were left out before it.
func (l *holdsLog) change(kinds uint32, now time.Time) (log bool, unlogged int) {
	if at, ok := l.logged[kinds]; ok && now.Sub(at) < HoldsRelogAfter {
		l.unlogged++
		return false, 0
	}
	if l.logged == nil {
		l.logged = map[uint32]time.Time{}
	}
	l.logged[kinds] = now
	unlogged, l.unlogged = l.unlogged, 0
	return true, unlogged
}
