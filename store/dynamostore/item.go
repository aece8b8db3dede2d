package dynamostore

import (
	"fmt"
	"math"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem/store"
)

// Attribute names of a record's item. Times are numbers: unix nanoseconds
// of the client's clock, except AttrTTL (unix seconds, for DynamoDB TTL).
const (
	AttrKey         = "key" // the partition key (string): the idem key as given
	attrStatus      = "status"
	attrPolicy      = "policy"
	attrFence       = "fence"
	attrAttempt     = "attempt"
	attrAttemptID   = "attempt_id" // absent when "" (abandoned, or an item from before attempt ids)
	attrOwner       = "owner"
	attrFingerprint = "fingerprint"
	attrResult      = "result" // binary
	attrReason      = "reason"
	attrLeaseUntil  = "lease_until"
	attrExpiresAt   = "expires_at"
	attrCreatedAt   = "created_at"
	attrUpdatedAt   = "updated_at"
	attrCall        = "call"    // the id of the call that wrote the item last
	attrJournal     = "journal" // a map from fence (decimal) to entry, whose members are the store.Wire* names
	// AttrTTL is the attribute to name in the table's TTL setting: when
	// DynamoDB may delete the item (ExpiresAt plus [WithKeepExpired]), in
	// unix seconds. [CreateTable] enables TTL on it.
	AttrTTL = "ttl"
)

// itemAttrs is the most attributes an item has (the constants above).
const itemAttrs = 17

// MaxItemSize is DynamoDB's limit on the size of an item (400 KB). The
// store refuses, before sending, a write that it can tell would exceed it.
const MaxItemSize = 400 * 1024

// MaxResultSize is the largest result [Store.Finish] and
// [Store.Resolve] accept: what is left of [MaxItemSize] once room is kept
// for the rest of the record (key, journal, reasons). A larger result is
// refused with an error wrapping [ErrItemTooLarge] before anything is sent.
const MaxResultSize = 350 * 1024

// MaxReasonLen is the longest reason (an error's text) the store keeps, in
// bytes; a longer one is cut at a character boundary and ends in "…".
const MaxReasonLen = 2048

func num(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}

func str(s string) types.AttributeValue { return &types.AttributeValueMemberS{Value: s} }

// nanos is t in unix nanoseconds, saturated at the int64 range (years 1677
// to 2262): t.UnixNano wraps around past it, and a lease or retention of
// time.Duration(math.MaxInt64), the usual "forever", would otherwise be
// stored as a time long past (a lease lapsed at once, a record expired at
// once).
func nanos(t time.Time) types.AttributeValue {
	switch {
	case t.After(maxNanos):
		return num(math.MaxInt64)
	case t.Before(minNanos):
		return num(math.MinInt64)
	}
	return num(t.UnixNano())
}

var (
	maxNanos = time.Unix(0, math.MaxInt64)
	minNanos = time.Unix(0, math.MinInt64)
)

// ttlSeconds is the TTL attribute's value for a record expiring at exp.
func ttlSeconds(exp time.Time, keep time.Duration) types.AttributeValue {
	t := exp.Add(keep)
	s := t.Unix()
	if t.Nanosecond() > 0 {
		s++
	}
	return num(s)
}

// capReason cuts r to MaxReasonLen bytes.
func capReason(r string) string {
	if len(r) <= MaxReasonLen {
		return r
	}
	const ell = "…"
	n := MaxReasonLen - len(ell)
	for n > 0 && !utf8.RuneStart(r[n]) {
		n--
	}
	return r[:n] + ell
}

// encode returns the item of rec, written by call.
func encode(rec *store.Record, call string, keep time.Duration) map[string]types.AttributeValue {
	// Sized for every attribute at once: grown entry by entry, the map
	// would be copied on the way.
	it := make(map[string]types.AttributeValue, itemAttrs)
	it[AttrKey] = str(rec.Key)
	it[attrStatus] = str(string(rec.Status))
	it[attrPolicy] = str(rec.Policy.String())
	it[attrFence] = num(rec.Fence)
	it[attrAttempt] = num(int64(rec.Attempt))
	it[attrExpiresAt] = nanos(rec.ExpiresAt)
	it[AttrTTL] = ttlSeconds(rec.ExpiresAt, keep)
	it[attrCall] = str(call)
	// Always present, even empty: a claim's update sets them only where
	// they are missing (see Store.Claim).
	it[attrOwner] = str(rec.Owner)
	it[attrFingerprint] = str(rec.Fingerprint)
	putS(it, attrAttemptID, rec.AttemptID)
	putS(it, attrReason, rec.Reason)
	if len(rec.Result) > 0 {
		it[attrResult] = &types.AttributeValueMemberB{Value: rec.Result}
	}
	putT(it, attrLeaseUntil, rec.LeaseUntil)
	putT(it, attrCreatedAt, rec.CreatedAt)
	putT(it, attrUpdatedAt, rec.UpdatedAt)
	if len(rec.Journal) > 0 {
		j := make(map[string]types.AttributeValue, len(rec.Journal))
		for i := range rec.Journal {
			e := &rec.Journal[i]
			j[strconv.FormatInt(e.Fence, 10)] = encodeEntry(e)
		}
		it[attrJournal] = &types.AttributeValueMemberM{Value: j}
	}
	return it
}

func encodeEntry(e *store.JournalEntry) types.AttributeValue {
	m := map[string]types.AttributeValue{
		store.WireAttempt: num(int64(e.Attempt)),
		store.WireFence:   num(e.Fence),
	}
	putS(m, store.WireAttemptID, e.AttemptID)
	putS(m, store.WireOwner, e.Owner)
	putS(m, store.WireCorrelation, e.Correlation)
	putT(m, store.WireStarted, e.Started)
	putT(m, store.WireLeaseUntil, e.LeaseUntil)
	putT(m, store.WireEnded, e.Ended)
	putS(m, store.WireOutcome, string(e.Outcome))
	putS(m, store.WireReason, e.Reason)
	putB(m, store.WireTakeover, e.Takeover)
	putB(m, store.WireAfterExpiry, e.AfterExpiry)
	putS(m, store.WirePolicy, e.Policy)
	putT(m, store.WireLateFinish, e.LateFinish)
	putS(m, store.WireResolvedBy, e.ResolvedBy)
	putB(m, store.WireDecision, e.Decision)
	return &types.AttributeValueMemberM{Value: m}
}

// Empty strings, zero times and false flags are left out: the item stays
// small.
func putS(m map[string]types.AttributeValue, name, v string) {
	if v != "" {
		m[name] = str(v)
	}
}

func putT(m map[string]types.AttributeValue, name string, t time.Time) {
	if !t.IsZero() {
		m[name] = nanos(t)
	}
}

func putB(m map[string]types.AttributeValue, name string, b bool) {
	if b {
		m[name] = &types.AttributeValueMemberBOOL{Value: true}
	}
}

// decoder reads an item, remembering the first problem.
type decoder struct {
	m   map[string]types.AttributeValue
	err error
}

func (d *decoder) fail(format string, args ...any) {
	if d.err == nil {
		d.err = fmt.Errorf(format, args...)
	}
}

func (d *decoder) s(name string, required bool) string {
	v, ok := d.m[name]
	if !ok {
		if required {
			d.fail("no %s", name)
		}
		return ""
	}
	s, ok := v.(*types.AttributeValueMemberS)
	if !ok {
		d.fail("%s is %T, want a string", name, v)
		return ""
	}
	return s.Value
}

func (d *decoder) n(name string, required bool) int64 {
	v, ok := d.m[name]
	if !ok {
		if required {
			d.fail("no %s", name)
		}
		return 0
	}
	n, ok := v.(*types.AttributeValueMemberN)
	if !ok {
		d.fail("%s is %T, want a number", name, v)
		return 0
	}
	i, err := strconv.ParseInt(n.Value, 10, 64)
	if err != nil {
		d.fail("%s = %q: not an integer", name, n.Value)
	}
	return i
}

func (d *decoder) t(name string, required bool) time.Time {
	if _, ok := d.m[name]; !ok && !required {
		return time.Time{}
	}
	return time.Unix(0, d.n(name, required)).UTC()
}

func (d *decoder) b(name string) bool {
	v, ok := d.m[name]
	if !ok {
		return false
	}
	b, ok := v.(*types.AttributeValueMemberBOOL)
	if !ok {
		d.fail("%s is %T, want a boolean", name, v)
		return false
	}
	return b.Value
}

// decode reads a record's item and the id of the call that wrote it last.
// A problem is an *store.CorruptError.
func decode(key string, it map[string]types.AttributeValue) (store.Record, string, error) {
	d := decoder{m: it}
	var r store.Record
	r.Key = d.s(AttrKey, true)
	if d.err == nil && r.Key != key {
		d.fail("the item of %q names the key %q", key, r.Key)
	}
	st := d.s(attrStatus, true)
	if d.err == nil {
		var err error
		if r.Status, err = store.ParseStatus(st); err != nil {
			d.fail("%v", err)
		}
	}
	pol := d.s(attrPolicy, true)
	if d.err == nil {
		var err error
		if r.Policy, err = store.ParsePolicy(pol); err != nil {
			d.fail("%v", err)
		}
	}
	r.Fence = d.n(attrFence, true)
	r.Attempt = int(d.n(attrAttempt, true))
	r.AttemptID = d.s(attrAttemptID, false)
	r.Owner = d.s(attrOwner, false)
	r.Fingerprint = d.s(attrFingerprint, false)
	r.Reason = d.s(attrReason, false)
	if v, ok := it[attrResult]; ok {
		b, ok := v.(*types.AttributeValueMemberB)
		if !ok {
			d.fail("%s is %T, want binary", attrResult, v)
		} else {
			r.Result = b.Value
		}
	}
	r.LeaseUntil = d.t(attrLeaseUntil, false)
	r.ExpiresAt = d.t(attrExpiresAt, true)
	r.CreatedAt = d.t(attrCreatedAt, false)
	r.UpdatedAt = d.t(attrUpdatedAt, false)
	call := d.s(attrCall, true)
	if v, ok := it[attrJournal]; ok {
		m, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			d.fail("%s is %T, want a map", attrJournal, v)
		} else {
			r.Journal = decodeJournal(&d, m.Value)
		}
	}
	if d.err != nil {
		return store.Record{}, "", &store.CorruptError{Key: key, Detail: "dynamostore: " + d.err.Error()}
	}
	return r, call, nil
}

func decodeJournal(d *decoder, m map[string]types.AttributeValue) []store.JournalEntry {
	j := make([]store.JournalEntry, 0, len(m))
	for name, v := range m {
		em, ok := v.(*types.AttributeValueMemberM)
		if !ok {
			d.fail("journal entry %s is %T, want a map", name, v)
			return nil
		}
		ed := decoder{m: em.Value}
		e := store.JournalEntry{
			Attempt:     int(ed.n(store.WireAttempt, true)),
			Fence:       ed.n(store.WireFence, true),
			AttemptID:   ed.s(store.WireAttemptID, false),
			Owner:       ed.s(store.WireOwner, false),
			Correlation: ed.s(store.WireCorrelation, false),
			Started:     ed.t(store.WireStarted, false),
			LeaseUntil:  ed.t(store.WireLeaseUntil, false),
			Ended:       ed.t(store.WireEnded, false),
			Outcome:     store.Outcome(ed.s(store.WireOutcome, false)),
			Reason:      ed.s(store.WireReason, false),
			Takeover:    ed.b(store.WireTakeover),
			AfterExpiry: ed.b(store.WireAfterExpiry),
			Policy:      ed.s(store.WirePolicy, false),
			LateFinish:  ed.t(store.WireLateFinish, false),
			ResolvedBy:  ed.s(store.WireResolvedBy, false),
			Decision:    ed.b(store.WireDecision),
		}
		if ed.err == nil && strconv.FormatInt(e.Fence, 10) != name {
			ed.fail("is named %s but holds fence %d", name, e.Fence)
		}
		if ed.err != nil {
			d.fail("journal entry %s: %v", name, ed.err)
			return nil
		}
		j = append(j, e)
	}
	// Oldest first: fences grow with every claim and resolution.
	for i := 1; i < len(j); i++ {
		for k := i; k > 0 && j[k].Fence < j[k-1].Fence; k-- {
			j[k], j[k-1] = j[k-1], j[k]
		}
	}
	return j
}

// itemSize is the size DynamoDB counts for an item: attribute names plus
// values, as its documentation describes.
func itemSize(it map[string]types.AttributeValue) int {
	n := 0
	for name, v := range it {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return (len(v.Value)+1)/2 + 1
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberM:
		n := 3
		for name, e := range v.Value {
			n += 1 + len(name) + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	}
	return 0
}
