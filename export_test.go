package idem

// CoalescingFlights is coalescingFlights (tests only).
const CoalescingFlights = coalescingFlights

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

// Coalescing reports whether l's claims are being coalesced (tests only).
func Coalescing(l *Ledger) bool {
	l.claims.mu.Lock()
	defer l.claims.mu.Unlock()
	return l.claims.coalescing
}
