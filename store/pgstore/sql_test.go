package pgstore

import (
	"reflect"
	"regexp"
	"strings"
	"testing"

	"github.com/idemkit/idem/store"
)

// TestWireNames: every statement has its journal member names put in
// (wireNames), and the names the statements use are the store package's.
func TestWireNames(t *testing.T) {
	for _, implicit := range []bool{true, false} {
		q := newQueries(`"t"`, `"clock"`, implicit)
		v := reflect.ValueOf(q)
		var all strings.Builder
		for i := range v.NumField() {
			sql := v.Field(i).String()
			if m := regexp.MustCompile(`\{[A-Z][A-Za-z]*\}`).FindString(sql); m != "" {
				t.Errorf("%s: %s left in the statement", v.Type().Field(i).Name, m)
			}
			all.WriteString(sql)
		}
		for _, name := range []string{store.WireAttempt, store.WireFence, store.WireAttemptID, store.WireOwner, store.WireCorrelation,
			store.WireStarted, store.WireLeaseUntil, store.WireEnded, store.WireOutcome, store.WireReason, store.WireTakeover,
			store.WireAfterExpiry, store.WirePolicy, store.WireLateFinish, store.WireResolvedBy, store.WireDecision} {
			if !strings.Contains(all.String(), "'"+name+"'") {
				t.Errorf("implicit=%v: no statement names the member %q", implicit, name)
			}
		}
	}
}
