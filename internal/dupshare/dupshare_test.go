package dupshare

import "testing"

func TestShareFollowsRecentClaims(t *testing.T) {
	var s Share
	if s.Often() {
		t.Fatal("a new Share says keys often exist")
	}
	for range 8 {
		s.Observe(true)
	}
	if !s.Often() {
		t.Fatal("after 8 claims that all found a record, Share still says keys are new")
	}
	for range 32 {
		s.Observe(false)
	}
	if s.Often() {
		t.Fatal("after 32 claims of new keys, Share still says keys often exist")
	}
	// One duplicate among new keys does not flip it.
	s.Observe(true)
	if s.Often() {
		t.Fatal("one duplicate among new keys made Share say keys often exist")
	}
}
