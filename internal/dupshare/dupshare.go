// Package dupshare follows the share of recent claims that found a record
// for their key (a duplicate, or a key claimed before), so that a store
// can start a claim the way that is cheapest for what its callers send:
// with a bare insert while keys are mostly new, with a read (or the full
// conditional write) while they mostly exist. Either start is correct;
// the share only decides the cost. A store whose cost is per batch of
// keys counts batches: one that had a key with a record is "found".
package dupshare

import "sync/atomic"

// one is a share of 1 in Share's fixed point.
const one = 1 << 16

// Share is a moving average, over about 16 claims, of whether a claim
// found a record. The zero value is ready to use and starts at "keys are
// new". It is safe for concurrent use; concurrent updates may blur the
// average but never move it outside [0, 1].
type Share struct {
	v atomic.Int64
}

// Observe counts one claim that found a record for its key (found) or not.
func (s *Share) Observe(found bool) {
	target := int64(0)
	if found {
		target = one
	}
	old := s.v.Load()
	s.v.Store(old + (target-old)/16)
}

// Often reports whether more than a quarter of recent claims found a
// record.
func (s *Share) Often() bool { return s.v.Load() > one/4 }
