package dynamostore

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/idemkit/idem"
	"github.com/idemkit/idem/idemtest"
	"github.com/idemkit/idem/store"
)

func claimReq(key string) store.ClaimRequest {
	return store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "w1", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}
}

// complete is the request that completes cr's attempt with result.
func complete(cr store.ClaimResult, result string) store.FinishRequest {
	return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
		Outcome: store.OutcomeCompleted, Result: []byte(result), Retention: time.Hour}
}

// release is the request that releases cr's attempt with reason.
func release(cr store.ClaimResult, reason string) store.FinishRequest {
	return store.FinishRequest{Key: cr.Record.Key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID,
		Outcome: store.OutcomeReleased, Reason: reason}
}

// first is the fence of a new item claimed at now: the store's clock in
// microseconds (store.FirstFence, no floor).
func first(now time.Time) int64 { return store.FirstFence(now, 0) }

// TestCreateTable: CreateTable makes a table the store works on, a second
// call leaves it as it is, and CheckTable tells a missing table and one
// with another key from a good one.
func TestCreateTable(t *testing.T) {
	c := testClient(t)
	ctx := context.Background()
	name := newTable(t) // CreateTable, as every test's table
	if err := CreateTable(ctx, c, name); err != nil && !errors.Is(err, ErrTTLUnsupported) {
		t.Fatalf("CreateTable on an existing table: %v", err)
	}
	if err := CheckTable(ctx, c, name); err != nil {
		t.Fatalf("CheckTable: %v", err)
	}
	if err := CheckTable(ctx, c, name+"-missing"); !errors.Is(err, ErrNoTable) {
		t.Fatalf("CheckTable(missing) = %v, want ErrNoTable", err)
	}
	other := name + "-other"
	_, err := c.CreateTable(ctx, &dynamodb.CreateTableInput{
		TableName:            aws.String(other),
		AttributeDefinitions: []types.AttributeDefinition{{AttributeName: aws.String("id"), AttributeType: types.ScalarAttributeTypeS}},
		KeySchema:            []types.KeySchemaElement{{AttributeName: aws.String("id"), KeyType: types.KeyTypeHash}},
		BillingMode:          types.BillingModePayPerRequest,
	})
	if err != nil {
		t.Fatalf("creating %s: %v", other, err)
	}
	t.Cleanup(func() { c.DeleteTable(context.Background(), &dynamodb.DeleteTableInput{TableName: aws.String(other)}) })
	if err := CreateTable(ctx, c, other); !errors.Is(err, ErrTableSchema) {
		t.Fatalf("CreateTable on a table keyed by id = %v, want ErrTableSchema", err)
	}
	// dynalite has no TTL: the table is ready, and the error says so.
	if err := enableTTL(ctx, c, name); err != nil && !errors.Is(err, ErrTTLUnsupported) {
		t.Fatalf("enableTTL: %v", err)
	}
}

// TestItemLayout: the item holds the TTL attribute in unix seconds
// (ExpiresAt plus the kept time, rounded up), and the record's times to
// the nanosecond.
func TestItemLayout(t *testing.T) {
	clock := idemtest.NewClock(time.Date(2030, 1, 2, 3, 4, 5, 600, time.UTC))
	s := New(testClient(t), newTable(t), WithClock(clock.Now), WithKeepExpired(2*time.Hour))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: %+v, %v", cr, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: 24 * time.Hour}); err != nil {
		t.Fatalf("Complete: %v", err)
	}
	it := rawItem(t, s, "k")
	exp := clock.Now().Add(24 * time.Hour)
	want := strconv.FormatInt(exp.Add(2*time.Hour).Unix()+1, 10)
	if got := it[AttrTTL].(*types.AttributeValueMemberN).Value; got != want {
		t.Fatalf("%s = %s, want %s (ExpiresAt %v + 2h, in seconds, rounded up)", AttrTTL, got, want, exp)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if !rec.ExpiresAt.Equal(exp) || !rec.CreatedAt.Equal(clock.Now()) {
		t.Fatalf("ExpiresAt %v, CreatedAt %v; want %v, %v to the nanosecond", rec.ExpiresAt, rec.CreatedAt, exp, clock.Now())
	}
	if len(rec.Journal) != 1 || rec.Journal[0].Outcome != store.OutcomeCompleted || rec.Owner != "w1" {
		t.Fatalf("record %+v, want one completed journal entry by w1", rec)
	}
}

// TestJournalOrder: the journal (a map by fence in the item) reads back
// oldest first, its fences crossing a power of ten (so not in string
// order: the clock starts 5 µs before 10^15 µs since 1970, and so does
// the first fence), and keeps the newest store.MaxJournal attempts.
func TestJournalOrder(t *testing.T) {
	clock := idemtest.NewClock(time.UnixMicro(1e15 - 5).UTC())
	s := New(testClient(t), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	const n = store.MaxJournal + 4
	for i := 1; i <= n; i++ {
		cr, err := s.Claim(ctx, claimReq("k"))
		if err != nil || !cr.Acquired {
			t.Fatalf("claim %d: %+v, %v", i, cr, err)
		}
		if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "again " + strconv.Itoa(i)}); err != nil {
			t.Fatalf("Release %d: %v", i, err)
		}
	}
	rec, err := s.Get(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if len(rec.Journal) != store.MaxJournal {
		t.Fatalf("journal has %d entries, want %d", len(rec.Journal), store.MaxJournal)
	}
	f0 := first(clock.Now())
	for i, e := range rec.Journal {
		nth := int64(n - store.MaxJournal + 1 + i) // the claim's number, from 1
		if want := f0 + nth - 1; e.Fence != want || e.Reason != "again "+strconv.FormatInt(nth, 10) {
			t.Fatalf("entry %d: fence %d reason %q, want fence %d reason %q", i, e.Fence, e.Reason, want, "again "+strconv.FormatInt(nth, 10))
		}
	}
}

// TestTooLarge: a result over MaxResultSize is refused with ErrItemTooLarge
// before sending, and the key stays held; a result near the limit is kept
// whole; an item that DynamoDB finds too large is reported with
// ErrItemTooLarge too; a long reason is cut, not refused.
func TestTooLarge(t *testing.T) {
	s := New(testClient(t), newTable(t))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("big"))
	if err != nil {
		t.Fatal(err)
	}
	err = s.Finish(ctx, store.FinishRequest{Key: "big", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: make([]byte, MaxResultSize+1), Retention: time.Hour})
	if !errors.Is(err, ErrItemTooLarge) {
		t.Fatalf("Complete with %d bytes = %v, want ErrItemTooLarge", MaxResultSize+1, err)
	}
	if rec, _ := s.Get(ctx, "big"); rec.Status != store.StatusInProgress {
		t.Fatalf("after a refused completion: %s, want in_progress", rec.Status)
	}
	near := bytes.Repeat([]byte("x"), MaxResultSize)
	if err := s.Finish(ctx, store.FinishRequest{Key: "big", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: near, Retention: time.Hour}); err != nil {
		t.Fatalf("Complete with %d bytes: %v", len(near), err)
	}
	if rec, _ := s.Get(ctx, "big"); !bytes.Equal(rec.Result, near) {
		t.Fatalf("result of %d bytes read back as %d bytes", len(near), len(rec.Result))
	}

	// A claim whose correlation id fills the item leaves no room for the
	// result: DynamoDB refuses the update.
	r := claimReq("crowded")
	r.Correlation = strings.Repeat("c", 100<<10)
	cr, err = s.Claim(ctx, r)
	if err != nil {
		t.Fatal(err)
	}
	err = s.Finish(ctx, store.FinishRequest{Key: "crowded", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: near, Retention: time.Hour})
	if !errors.Is(err, ErrItemTooLarge) {
		t.Fatalf("Complete of an item over 400 KB = %v, want ErrItemTooLarge", err)
	}
	r = claimReq("huge-claim")
	r.Correlation = strings.Repeat("c", MaxItemSize)
	if _, err := s.Claim(ctx, r); !errors.Is(err, ErrItemTooLarge) {
		t.Fatalf("Claim of an item over 400 KB = %v, want ErrItemTooLarge", err)
	}

	cr, err = s.Claim(ctx, claimReq("reason"))
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("é", MaxReasonLen)
	if err := s.Finish(ctx, store.FinishRequest{Key: "reason", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeFailed, Reason: long, Retention: time.Hour}); err != nil {
		t.Fatalf("Fail with a %d-byte reason: %v", len(long), err)
	}
	rec, _ := s.Get(ctx, "reason")
	if len(rec.Reason) > MaxReasonLen || !strings.HasPrefix(long, strings.TrimSuffix(rec.Reason, "…")) || !strings.HasSuffix(rec.Reason, "…") {
		t.Fatalf("reason kept as %d bytes %q..., want at most %d bytes, cut", len(rec.Reason), rec.Reason[:10], MaxReasonLen)
	}
}

// TestLostAnswer: when the answer to a write is lost after DynamoDB made
// it, the client retries; the retry's condition fails on the write's own
// item, and the call id tells the store that the write was its own. The
// claim is acquired (not busy), the completion succeeds (not a lost
// lease), the heartbeat returns its lease.
func TestLostAnswer(t *testing.T) {
	p := newProxy(t)
	clock := idemtest.NewClock(idemtest.ClockStart)
	table := newTable(t)
	s := New(newClient(p.URL()), table, WithClock(clock.Now))
	ctx := context.Background()

	p.Drop("PutItem", 1)
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired || cr.Record.Fence != first(clock.Now()) {
		t.Fatalf("Claim whose answer was lost = %+v, %v; want acquired, fence %d", cr, err, first(clock.Now()))
	}
	if p.Calls("PutItem") < 2 {
		t.Fatalf("PutItem sent %d times, want a retry", p.Calls("PutItem"))
	}
	p.Drop("UpdateItem", 1)
	until, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: 2 * time.Minute})
	if err != nil || !until.Equal(clock.Now().Add(2*time.Minute)) {
		t.Fatalf("Extend whose answer was lost = %v, %v", until, err)
	}
	p.Drop("UpdateItem", 1)
	if err := s.Finish(ctx, complete(cr, "r")); err != nil {
		t.Fatalf("Complete whose answer was lost: %v", err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusCompleted || string(rec.Result) != "r" {
		t.Fatalf("after: %+v, %v", rec, err)
	}
	// A second completion is still refused: it is not the same write.
	if err := s.Finish(ctx, complete(cr, "r")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second Complete = %v, want ErrLeaseLost", err)
	}

	// A takeover (the compare-and-set path) whose answer is lost.
	held, err := s.Claim(ctx, claimReq("t"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	p.Drop("PutItem", 2) // the claim's first put fails its condition; the second is the takeover
	cr, err = s.Claim(ctx, claimReq("t"))
	if err != nil || !cr.Acquired || !cr.Takeover || cr.Record.Fence != held.Record.Fence+1 {
		t.Fatalf("takeover whose answer was lost = %+v, %v; want acquired, takeover, fence %d", cr, err, held.Record.Fence+1)
	}
}

// TestAllOld: from an endpoint that returns the item with a failed
// condition (DynamoDB, asked with ReturnValuesOnConditionCheckFailure),
// the store decides from it without a GetItem.
func TestAllOld(t *testing.T) {
	p := newProxy(t)
	p.SetAllOld(true)
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(newClient(p.URL()), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired {
		t.Fatal(cr, err)
	}
	busy, err := s.Claim(ctx, claimReq("k"))
	if err != nil || busy.Acquired || busy.Record.Fence != cr.Record.Fence || busy.Record.AttemptID != cr.Record.AttemptID || busy.Record.Status != store.StatusInProgress {
		t.Fatalf("claim of a held key = %+v, %v; want not acquired, in_progress, the holder's fence %d and attempt", busy, err, cr.Record.Fence)
	}
	if err := s.Finish(ctx, complete(cr, "r")); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, complete(cr, "r")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("second Complete = %v, want ErrLeaseLost", err)
	}
	dup, err := s.Claim(ctx, claimReq("k"))
	if err != nil || dup.Acquired || dup.Record.Status != store.StatusCompleted || string(dup.Record.Result) != "r" {
		t.Fatalf("claim of a done key = %+v, %v", dup, err)
	}
	// A released key is taken from the returned item with one more
	// PutItem, conditioned on that item.
	r1, err := s.Claim(ctx, claimReq("r"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, release(r1, "again")); err != nil {
		t.Fatal(err)
	}
	puts := p.Calls("PutItem")
	cr, err = s.Claim(ctx, claimReq("r"))
	if err != nil || !cr.Acquired || cr.Record.Fence != r1.Record.Fence+1 || cr.Record.Attempt != 2 {
		t.Fatalf("claim of a released key = %+v, %v; want acquired, fence %d", cr, err, r1.Record.Fence+1)
	}
	if n := p.Calls("PutItem") - puts; n != 2 {
		t.Fatalf("claim of a released key sent %d PutItem, want 2", n)
	}
	if n := p.Calls("GetItem"); n != 0 {
		t.Fatalf("the store sent %d GetItem, want none", n)
	}
	if s.allOld.Load() != 4 {
		t.Fatalf("%d items taken from failed conditions, want 4", s.allOld.Load())
	}
	// A corrupt item returned with the failure is corrupt, not absent.
	corrupt(t, s, "k")
	if _, err := s.Claim(ctx, claimReq("k")); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("claim of a corrupt record = %v, want ErrCorrupt", err)
	}
}

// TestEndpointGoesAway: an endpoint that stops answering in the middle of
// the calls gives errors, never outcomes: not busy, not lease lost, not
// not-found, and the Ledger reports a store error without running fn.
func TestEndpointGoesAway(t *testing.T) {
	p := newProxy(t)
	s := New(newClient(p.URL(), func(o *dynamodb.Options) { o.RetryMaxAttempts = 2 }), newTable(t))
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("held"))
	if err != nil {
		t.Fatal(err)
	}
	p.SetDown(true)
	outcomes := []error{idem.ErrInProgress, store.ErrLeaseLost, store.ErrNotFound, store.ErrCorrupt}
	notOutcome := func(what string, err error) {
		t.Helper()
		if err == nil {
			t.Fatalf("%s on a vanished endpoint: no error", what)
		}
		for _, o := range outcomes {
			if errors.Is(err, o) {
				t.Fatalf("%s on a vanished endpoint: %v reads as %v", what, err, o)
			}
		}
	}
	_, err = s.Claim(ctx, claimReq("new"))
	notOutcome("Claim", err)
	notOutcome("Complete", s.Finish(ctx, store.FinishRequest{Key: "held", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}))
	_, err = s.Extend(ctx, store.ExtendRequest{Key: "held", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: time.Minute})
	notOutcome("Extend", err)
	notOutcome("Release", s.Finish(ctx, store.FinishRequest{Key: "held", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: ""}))
	_, err = s.Get(ctx, "held")
	notOutcome("Get", err)
	notOutcome("Delete", s.Delete(ctx, "held"))
	_, err = s.Resolve(ctx, store.ResolveRequest{Key: "held", Done: true})
	notOutcome("Resolve", err)
	_, err = s.List(ctx, store.ListQuery{})
	notOutcome("List", err)
	_, err = s.Sweep(ctx, 10)
	notOutcome("Sweep", err)
	ran := false
	_, err = idem.New(s, idem.WithLogger(slog.New(slog.DiscardHandler))).Do(ctx, idem.Key("do"), func(context.Context) ([]byte, error) { ran = true; return nil, nil })
	var se *idem.StoreError
	if !errors.As(err, &se) || ran {
		t.Fatalf("Do on a vanished endpoint: %v (ran %v), want a *idem.StoreError and fn not run", err, ran)
	}
	// Back again: nothing was decided while it was away.
	p.SetDown(false)
	rec, err := s.Get(ctx, "held")
	if err != nil || rec.Status != store.StatusInProgress || rec.Fence != cr.Record.Fence || rec.AttemptID != cr.Record.AttemptID {
		t.Fatalf("after the endpoint came back: %+v, %v; want in_progress, held by the claim (fence %d)", rec, err, cr.Record.Fence)
	}
}

// TestClockSkew shows the consequence the package doc states: leases are
// read on each caller's clock, so a caller whose clock runs ahead by more
// than what is left of a lease takes the key over while its holder runs.
func TestClockSkew(t *testing.T) {
	table := newTable(t)
	base := idemtest.NewClock(idemtest.ClockStart)
	ahead := func() time.Time { return base.Now().Add(2 * time.Minute) }
	a := New(testClient(t), table, WithClock(base.Now))
	b := New(testClient(t), table, WithClock(ahead))
	ctx := context.Background()
	held, err := a.Claim(ctx, claimReq("k"))
	if err != nil {
		t.Fatal(err)
	}
	cr, err := b.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired || !cr.Takeover {
		t.Fatalf("claim by a clock 2 minutes ahead of a 1-minute lease = %+v, %v; want a takeover", cr, err)
	}
	// The fence still refuses the first holder.
	if err := a.Finish(ctx, complete(held, "")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("first holder's Complete after the skewed takeover = %v, want ErrLeaseLost", err)
	}
}

// TestBatchRepeats: ClaimBatch with one key many times and many keys
// claims each key once, in request order.
func TestBatchRepeats(t *testing.T) {
	s := New(testClient(t), newTable(t))
	var reqs []store.ClaimRequest
	for i := range 40 {
		reqs = append(reqs, claimReq("k"+strconv.Itoa(i%20)))
	}
	before := time.Now()
	res, err := s.ClaimBatch(context.Background(), reqs)
	if err != nil {
		t.Fatal(err)
	}
	for i, r := range res {
		if r.Acquired != (i < 20) || r.Record.Key != reqs[i].Key {
			t.Fatalf("result %d: %+v, want acquired %v for %s", i, r, i < 20, reqs[i].Key)
		}
		// A first claim's fence is the clock's at the claim; a repeat
		// finds the first claim's attempt.
		if i < 20 && (r.Record.Fence < first(before) || r.Record.AttemptID != reqs[i].AttemptID) {
			t.Fatalf("result %d: fence %d attempt %q, want at least %d, attempt %q", i, r.Record.Fence, r.Record.AttemptID, first(before), reqs[i].AttemptID)
		}
		if i >= 20 && (r.Record.Fence != res[i-20].Record.Fence || r.Record.AttemptID != reqs[i-20].AttemptID) {
			t.Fatalf("result %d: fence %d attempt %q, want the first claim's %d %q", i, r.Record.Fence, r.Record.AttemptID, res[i-20].Record.Fence, reqs[i-20].AttemptID)
		}
	}
	s.Close()
	if _, err := s.ClaimBatch(context.Background(), reqs); !errors.Is(err, store.ErrClosed) {
		t.Fatalf("ClaimBatch after Close = %v, want ErrClosed", err)
	}
}

// itemOf reports whether the request body writes or reads key's item.
func itemOf(body []byte, key string) bool {
	return bytes.Contains(body, []byte(`"`+AttrKey+`":{"S":"`+key+`"}`))
}

// noRetries makes a client give up at the first failure of a request.
func noRetries(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }

// TestBatchKeyFailures: in ClaimBatch, a failure of one key alone is that
// key's ClaimResult.Err, and the batch's other keys are claimed (the
// batch used to fail as a whole, though it had made their claims, and
// their callers could neither run nor release them): a record too large
// (ErrItemTooLarge), a record that keeps changing under the claim
// (ErrContention), a write still throttled when the client's retries are
// spent. Nothing is written for those keys.
func TestBatchKeyFailures(t *testing.T) {
	p := newProxy(t)
	table := newTable(t)
	raw := New(testClient(t), table) // not through the proxy
	s := New(newClient(p.URL(), noRetries), table)
	ctx := context.Background()
	cr, err := s.Claim(ctx, claimReq("churn"))
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "churn", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeReleased, Reason: "free"}); err != nil {
		t.Fatal(err)
	}
	p.SetIntercept(func(op string, body []byte) (int, []byte, bool) {
		switch {
		case op == "PutItem" && itemOf(body, "hot"):
			return 400, []byte(`{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",` +
				`"message":"The level of configured provisioned throughput for the table was exceeded."}`), true
		case op == "PutItem" && itemOf(body, "churn"):
			// Another writer changes the record just before each write.
			_, err := raw.Client().UpdateItem(ctx, &dynamodb.UpdateItemInput{
				TableName: aws.String(table), Key: raw.keyOf("churn"),
				UpdateExpression:          aws.String("SET #c = :c"),
				ExpressionAttributeNames:  map[string]string{"#c": attrCall},
				ExpressionAttributeValues: map[string]types.AttributeValue{":c": str(newCall())},
			})
			if err != nil {
				t.Errorf("changing churn: %v", err)
			}
		}
		return 0, nil, false
	})
	big := claimReq("big")
	big.Correlation = strings.Repeat("c", MaxItemSize)
	reqs := []store.ClaimRequest{claimReq("a"), big, claimReq("hot"), claimReq("churn"), claimReq("b"), claimReq("a")}
	res, err := s.ClaimBatch(ctx, reqs)
	if err != nil {
		t.Fatalf("ClaimBatch with keys that fail alone = %v, want their failures in their results", err)
	}
	var ae interface{ ErrorCode() string }
	for i, want := range []struct {
		acquired bool
		err      func(error) bool
	}{
		{true, nil},
		{false, func(err error) bool { return errors.Is(err, ErrItemTooLarge) }},
		{false, func(err error) bool {
			return errors.As(err, &ae) && ae.ErrorCode() == "ProvisionedThroughputExceededException"
		}},
		{false, func(err error) bool { return errors.Is(err, ErrContention) }},
		{true, nil},
		{false, nil}, // a's second claim finds the first
	} {
		r := res[i]
		if r.Record.Key != reqs[i].Key || r.Acquired != want.acquired || (r.Err == nil) != (want.err == nil) || r.Err != nil && !want.err(r.Err) {
			t.Errorf("result %d (%s): acquired %v, err %v", i, reqs[i].Key, r.Acquired, r.Err)
		}
	}
	for _, k := range []string{"big", "hot"} {
		if _, err := raw.Get(ctx, k); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Get(%s) after its failed claim = %v, want ErrNotFound", k, err)
		}
	}
	if rec, err := raw.Get(ctx, "churn"); err != nil || rec.Status != store.StatusReleased || rec.Fence != cr.Record.Fence {
		t.Errorf("churn after its failed claim: %s at fence %d, %v; want released at fence %d", rec.Status, rec.Fence, err, cr.Record.Fence)
	}
}

// TestBatchStoreError: when a claim of ClaimBatch fails for the store
// (here the endpoint hangs up on one key's write), the batch waits for the
// claims in flight, undoes those it made, and returns the error. A key
// it acquired is released, not left held by nobody (it used to be: once
// the lease passed, an AtMostOnce key was indeterminate though nothing
// ran); a takeover it made is abandoned, lapsed at once (not busy for a
// lease). Both are recorded as not run: the next call's Reconcile hook is
// not asked about a released key, and is asked about the attempt before
// the takeover.
func TestBatchStoreError(t *testing.T) {
	p := newProxy(t)
	clock := idemtest.NewClock(idemtest.ClockStart)
	table := newTable(t)
	s := New(newClient(p.URL(), noRetries), table, WithClock(clock.Now))
	ctx := context.Background()
	most := func(k string) store.ClaimRequest {
		r := claimReq(k)
		r.Policy = store.AtMostOnce
		return r
	}
	// A lapsed AtLeastOnce attempt, which the batch takes over.
	if cr, err := s.Claim(ctx, claimReq("t")); err != nil || !cr.Acquired {
		t.Fatal(cr, err)
	}
	clock.Advance(2 * time.Minute)
	p.SetIntercept(func(op string, body []byte) (int, []byte, bool) {
		if op == "PutItem" && itemOf(body, "down") {
			time.Sleep(300 * time.Millisecond) // the other claims are made first
			return 0, nil, true
		}
		return 0, nil, false
	})
	reqs := []store.ClaimRequest{claimReq("t")}
	for i := range 8 {
		reqs = append(reqs, most("g"+strconv.Itoa(i)))
	}
	reqs = append(reqs, most("down"))
	res, err := s.ClaimBatch(ctx, reqs)
	if err == nil || res != nil {
		t.Fatalf("ClaimBatch whose endpoint hung up on one key = %d results, %v; want an error", len(res), err)
	}
	p.SetIntercept(nil)
	if _, err := s.Get(ctx, "down"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Get(down) = %v, want ErrNotFound", err)
	}
	var fresh []string
	for _, r := range reqs[1 : len(reqs)-1] {
		fresh = append(fresh, r.Key)
	}
	idemtest.CheckUndone(t, s, fresh, "t", claimReq("t"))
}

// TestReadFirst: with WithReadFirst a claim reads first: a duplicate or a
// busy key is one GetItem and no write; a new key, a released, expired or
// lapsed one is a GetItem and one conditioned PutItem; and a write that
// slips in between the read and the claim's write makes the claim decide
// again on what that write left.
func TestReadFirst(t *testing.T) {
	p := newProxy(t)
	clock := idemtest.NewClock(idemtest.ClockStart)
	table := newTable(t)
	s := New(newClient(p.URL()), table, WithClock(clock.Now), WithReadFirst(true))
	ctx := context.Background()
	calls := func(what string, gets, puts int) {
		t.Helper()
		if g, pu := p.Calls("GetItem"), p.Calls("PutItem"); g != gets || pu != puts {
			t.Fatalf("%s: %d GetItem and %d PutItem so far, want %d and %d", what, g, pu, gets, puts)
		}
	}
	cr, err := s.Claim(ctx, claimReq("k"))
	f0 := first(clock.Now())
	if err != nil || !cr.Acquired || cr.Record.Fence != f0 {
		t.Fatalf("claim of a new key: %+v, %v; want fence %d", cr, err, f0)
	}
	calls("new key", 1, 1)
	if busy, err := s.Claim(ctx, claimReq("k")); err != nil || busy.Acquired || busy.Record.Fence != f0 || busy.Record.AttemptID != cr.Record.AttemptID {
		t.Fatalf("claim of a busy key: %+v, %v", busy, err)
	}
	calls("busy key", 2, 1)
	if err := s.Finish(ctx, release(cr, "retry")); err != nil {
		t.Fatal(err)
	}
	cr, err = s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired || cr.Record.Fence != f0+1 || cr.Record.Reason != "retry" {
		t.Fatalf("claim of a released key: %+v, %v", cr, err)
	}
	calls("released key", 3, 2)
	clock.Advance(time.Minute)
	cr, err = s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired || !cr.Takeover || cr.Record.Fence != f0+2 {
		t.Fatalf("claim of a lapsed key: %+v, %v", cr, err)
	}
	if err := s.Finish(ctx, complete(cr, "r")); err != nil {
		t.Fatal(err)
	}
	if dup, err := s.Claim(ctx, claimReq("k")); err != nil || dup.Acquired || string(dup.Record.Result) != "r" {
		t.Fatalf("claim of a done key: %+v, %v", dup, err)
	}
	calls("done key", 5, 3)
	clock.Advance(2 * time.Hour)
	cr, err = s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Acquired || cr.Record.Fence != f0+3 || !cr.Record.Journal[len(cr.Record.Journal)-1].AfterExpiry {
		t.Fatalf("claim of an expired key: %+v, %v", cr, err)
	}

	// Another worker claims "race" between this claim's read and write.
	other := New(testClient(t), table, WithClock(clock.Now))
	var oc store.ClaimResult
	p.SetBefore(func(op string) {
		if op == "PutItem" {
			p.SetBefore(nil)
			var err error
			if oc, err = other.Claim(ctx, claimReq("race")); err != nil || !oc.Acquired {
				t.Errorf("the other worker's claim: %+v, %v", oc, err)
			}
		}
	})
	cr, err = s.Claim(ctx, claimReq("race"))
	if err != nil || cr.Acquired || cr.Record.Fence != oc.Record.Fence || cr.Record.AttemptID != oc.Record.AttemptID || cr.Record.Status != store.StatusInProgress {
		t.Fatalf("claim that lost the race after its read: %+v, %v; want busy, held by the other worker's claim", cr, err)
	}
	// A corrupt record is never read as absent.
	corrupt(t, s, "k")
	if _, err := s.Claim(ctx, claimReq("k")); !errors.Is(err, store.ErrCorrupt) {
		t.Fatalf("claim of a corrupt record = %v, want ErrCorrupt", err)
	}
}

// TestExtendPastExpiry: a heartbeat that takes the lease past the record's
// ExpiresAt moves ExpiresAt (and the TTL attribute) with it, so that the
// record of a running attempt never expires under it.
func TestExtendPastExpiry(t *testing.T) {
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(testClient(t), newTable(t), WithClock(clock.Now), WithKeepExpired(0))
	ctx := context.Background()
	r := claimReq("k")
	r.Lease, r.Retention = time.Minute, 0 // expires with its lease
	cr, err := s.Claim(ctx, r)
	if err != nil || !cr.Record.ExpiresAt.Equal(cr.Record.LeaseUntil) {
		t.Fatalf("Claim: %+v, %v; want ExpiresAt at the lease's end", cr, err)
	}
	clock.Advance(50 * time.Second)
	until, err := s.Extend(ctx, store.ExtendRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Lease: 10 * time.Minute})
	if err != nil || !until.Equal(clock.Now().Add(10*time.Minute)) {
		t.Fatalf("Extend past ExpiresAt = %v, %v", until, err)
	}
	clock.Advance(5 * time.Minute) // past the first ExpiresAt
	rec, err := s.Get(ctx, "k")
	if err != nil || !rec.ExpiresAt.Equal(until) || !rec.LeaseUntil.Equal(until) {
		t.Fatalf("after the extension: %+v, %v; want ExpiresAt and LeaseUntil %v", rec, err, until)
	}
	if got, want := rawItem(t, s, "k")[AttrTTL].(*types.AttributeValueMemberN).Value, strconv.FormatInt(until.Unix(), 10); got != want {
		t.Fatalf("%s = %s, want %s", AttrTTL, got, want)
	}
	if busy, err := s.Claim(ctx, r); err != nil || busy.Acquired {
		t.Fatalf("claim while the extended lease runs: %+v, %v; want busy", busy, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("r"), Retention: time.Hour}); err != nil {
		t.Fatalf("Complete after the extension: %v", err)
	}
}

// TestInvalidPathIsAFailedCondition: where DynamoDB refuses a finishing
// update for the journal path the item lacks (an absent key, a record of
// another fence) rather than failing its condition, the store decides
// from the item as for a failed condition: a lost lease, not a store
// error, and the stale attempt's journal entry marked.
func TestInvalidPathIsAFailedCondition(t *testing.T) {
	p := newProxy(t)
	p.SetPathErr(true)
	clock := idemtest.NewClock(idemtest.ClockStart)
	s := New(newClient(p.URL()), newTable(t), WithClock(clock.Now))
	ctx := context.Background()
	absent := store.FinishRequest{Key: "absent", Fence: 1, AttemptID: "none", Outcome: store.OutcomeCompleted, Retention: time.Hour}
	if err := s.Finish(ctx, absent); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Complete of an absent key = %v, want ErrLeaseLost", err)
	}
	stale, err := s.Claim(ctx, claimReq("k"))
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(2 * time.Minute)
	cr, err := s.Claim(ctx, claimReq("k"))
	if err != nil || !cr.Takeover {
		t.Fatalf("takeover: %+v, %v", cr, err)
	}
	if err := s.Finish(ctx, complete(stale, "late")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("stale Complete = %v, want ErrLeaseLost", err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Journal[0].LateFinish.IsZero() || rec.Status != store.StatusInProgress || rec.Fence != stale.Record.Fence+1 {
		t.Fatalf("after the stale Complete: %+v, %v; want fence %d in_progress, the first entry marked LateFinish", rec, err, stale.Record.Fence+1)
	}
	if err := s.Finish(ctx, complete(cr, "r")); err != nil {
		t.Fatalf("holder's Complete: %v", err)
	}
}

// TestForeverRetention: the longest durations (time.Duration(math.MaxInt64),
// the usual "keep it forever", or any lease or retention reaching past
// 2262) keep the lease running and the record remembered, instead of
// wrapping around in the item's unix nanoseconds into a time long past:
// the holder's Complete was refused as if the record had expired, and the
// key was claimed and run again.
func TestForeverRetention(t *testing.T) {
	s := New(testClient(t), newTable(t))
	ctx := context.Background()
	forever := time.Duration(math.MaxInt64)
	cr, err := s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Lease: forever, Retention: forever})
	if err != nil || !cr.Acquired {
		t.Fatalf("Claim: acquired %v, %v", cr.Acquired, err)
	}
	if busy, err := s.Claim(ctx, claimReq("k")); err != nil || busy.Acquired {
		t.Fatalf("claim of a key held with lease %v: acquired %v, %v; want busy", forever, busy.Acquired, err)
	}
	if err := s.Finish(ctx, store.FinishRequest{Key: "k", Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: store.OutcomeCompleted, Result: []byte("v"), Retention: forever}); err != nil {
		t.Fatalf("Complete with retention %v: %v", forever, err)
	}
	rec, err := s.Get(ctx, "k")
	if err != nil || rec.Status != store.StatusCompleted {
		t.Fatalf("Get after Complete with retention %v = %v, %v; want completed", forever, rec.Status, err)
	}
	if again, err := s.Claim(ctx, claimReq("k")); err != nil || again.Acquired {
		t.Fatalf("claim of a key completed with retention %v: acquired %v, %v; want a duplicate", forever, again.Acquired, err)
	}
}
