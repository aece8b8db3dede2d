package idem

// CoalescingQueued reports how many calls wait for a batch of l's claims
// (tests only).
func CoalescingQueued(l *Ledger) int {
	if l.claims == nil {
		return -1
	}
	l.claims.mu.Lock()
	defer l.claims.mu.Unlock()
	return len(l.claims.queue)
}

// CoalesceAtAnyLoad makes l's batchers coalesce from the first call on and
// never stop, so that tests can make batches form with a few calls (call
// it before any).
func CoalesceAtAnyLoad(l *Ledger) { SetCoalescingLoad(l, 1, 0) }

// SetCoalescingLoad sets the load at which l's batchers start coalescing
// (from calls at once) and stop (batches averaging fewer than minBatch
// calls). Call it before any call.
func SetCoalescingLoad(l *Ledger, from, minBatch int) {
	if l.claims != nil {
		l.claims.from, l.claims.minBatch = from, minBatch
	}
	if l.completes != nil {
		l.completes.from, l.completes.minBatch = from, minBatch
	}
}

// Coalescing reports whether l's claims are being coalesced (tests only).
func Coalescing(l *Ledger) bool {
	l.claims.mu.Lock()
	defer l.claims.mu.Unlock()
	return l.claims.coalescing
}
