package flows

// Dropped counts changes not delivered to slow watchers.
func (t *Tracker) Dropped() uint64 { return t.dropped.Load() }
