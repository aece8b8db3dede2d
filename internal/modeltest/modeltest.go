// Package modeltest runs random operations against a store and against
// the store package (the rules every store implements) and compares every
// answer and every record: a differential test for the stores that
// re-implement the rules in their backend (SQL, Lua, DynamoDB conditions).
package modeltest

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// Config describes the store under test.
type Config struct {
	Store store.Store
	// Advance moves the store's clock forward by d.
	Advance func(d time.Duration)
	// Exact: the store's clock is the test's (it does not run on by
	// itself), so times must match exactly and boundaries are exact.
	Exact bool
	// Sweep: compare Sweep's count with the model's.
	Sweep bool
}

type model struct {
	t       *testing.T
	c       Config
	now     time.Time
	start   time.Time
	records map[string]*idem.Record
}

// Run runs steps random operations from seed.
func Run(t *testing.T, c Config, seed uint64, steps int) {
	ctx := context.Background()
	m := &model{t: t, c: c, records: map[string]*idem.Record{}, start: time.Now()}
	var err error
	if m.now, err = c.Store.Now(ctx); err != nil {
		t.Fatal(err)
	}
	s := c.Store
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	keys := []string{"a", "b", "c"}
	pick := func(xs ...time.Duration) time.Duration { return xs[r.IntN(len(xs))] }
	reason := func(s string) string {
		if r.IntN(3) == 0 {
			return ""
		}
		return s
	}
	// attemptOf names an attempt of key for a write: usually the one the
	// model's record holds, else a stale or unknown one (another fence,
	// another attempt id).
	attemptOf := func(key string) (int64, string) {
		rec := m.records[key]
		if rec == nil {
			return 1, "none"
		}
		id := rec.AttemptID
		if id == "" {
			// An abandoned attempt gave its id up (a write naming ""
			// is refused before the rules see it): the attempt itself
			// tries again, with its id from the journal.
			id = "abandoned"
			if n := len(rec.Journal); n > 0 && rec.Journal[n-1].AttemptID != "" {
				id = rec.Journal[n-1].AttemptID
			}
		}
		switch r.IntN(6) {
		case 0:
			return rec.Fence - 1, id
		case 1:
			return rec.Fence + 1, id
		case 2:
			return rec.Fence, "other"
		}
		return rec.Fence, id
	}
	claimReq := func(key string, step int) store.ClaimRequest {
		req := store.ClaimRequest{AttemptID: store.NewAttemptID(),
			Key: key, Owner: fmt.Sprintf("w%d", r.IntN(3)), Correlation: fmt.Sprintf("c%d", step),
			Policy: idem.Policy(r.IntN(2)), TakeLapsed: r.IntN(4) == 0,
			Lease:     pick(time.Minute, 2*time.Minute, 10*time.Minute),
			Retention: pick(time.Minute, 5*time.Minute, time.Hour),
		}
		if r.IntN(4) == 0 {
			req.Owner, req.Correlation = "", ""
		}
		if r.IntN(2) == 0 {
			req.Fingerprint = fmt.Sprint("fp", r.IntN(2))
		}
		return req
	}
	for step := range steps {
		key := keys[r.IntN(len(keys))]
		fence, id := attemptOf(key)
		end := func(o store.Outcome, result []byte, reason string, ret time.Duration) store.FinishRequest {
			return store.FinishRequest{Key: key, Fence: fence, AttemptID: id, Outcome: o, Result: result, Reason: reason, Retention: ret}
		}
		what := ""
		switch op := r.IntN(15); op {
		case 0, 1, 2:
			req := claimReq(key, step)
			what = fmt.Sprintf("Claim(%+v)", req)
			cr, err := s.Claim(ctx, req)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			m.claimed(what, req, cr)
		case 3:
			res := []byte(fmt.Sprint("result-", step))
			if r.IntN(4) == 0 {
				res = nil
			}
			ret := pick(time.Minute, time.Hour)
			req := end(store.OutcomeCompleted, res, "", ret)
			what = fmt.Sprintf("Finish(%+v)", req)
			m.finish(what, req, s.Finish(ctx, req))
		case 4:
			ret := pick(time.Minute, time.Hour)
			rs := reason("failed")
			req := end(store.OutcomeFailed, nil, rs, ret)
			what = fmt.Sprintf("Finish(%+v)", req)
			m.finish(what, req, s.Finish(ctx, req))
		case 5:
			rs := reason("released")
			if r.IntN(3) == 0 {
				rs = store.NotRunReason(rs) // an undone claim: no late finish
			}
			req := end(store.OutcomeReleased, nil, rs, 0)
			what = fmt.Sprintf("Finish(%+v)", req)
			m.finish(what, req, s.Finish(ctx, req))
		case 6:
			rs := reason("abandoned")
			if r.IntN(3) == 0 {
				rs = store.NotRunReason(rs)
			}
			req := end(store.OutcomeAbandoned, nil, rs, 0)
			what = fmt.Sprintf("Finish(%+v)", req)
			m.finish(what, req, s.Finish(ctx, req))
		case 7:
			lease := pick(time.Minute, 3*time.Minute, 2*time.Hour)
			req := store.ExtendRequest{Key: key, Fence: fence, AttemptID: id, Lease: lease}
			what = fmt.Sprintf("Extend(%+v)", req)
			until, err := s.Extend(ctx, req)
			next, merr := applyExtend(m.records[key], req, m.now)
			m.sameErr(what, err, merr)
			if next != nil {
				m.records[key] = next
			}
			if err == nil {
				m.sameTime(what+" lease", until, next.LeaseUntil)
			}
		case 8:
			res := store.ResolveRequest{Key: key, Done: r.IntN(2) == 0, Result: []byte("resolved"), Reason: reason("op says"),
				By: fmt.Sprint("op", r.IntN(2)), InProgress: r.IntN(2) == 0, Lapsed: r.IntN(4) == 0}
			if r.IntN(2) == 0 {
				res.Retention = 10 * time.Minute
			}
			if r.IntN(4) == 0 {
				res.By = ""
			}
			if r.IntN(2) == 0 {
				res.Fence = fence
			}
			if r.IntN(3) == 0 {
				res.AttemptID = id
			}
			what = fmt.Sprintf("Resolve(%+v)", res)
			got, err := s.Resolve(ctx, res)
			next, merr := store.ApplyResolve(m.records[key], res, m.now)
			m.sameErr(what, err, merr)
			if merr == nil {
				m.records[key] = next
				m.sameRecord(what, got, *next)
			}
		case 9:
			d := pick(0, time.Minute, 2*time.Minute, 5*time.Minute, 30*time.Minute, 61*time.Minute)
			if rec := m.records[key]; rec != nil && r.IntN(2) == 0 {
				// Exactly to a boundary of the key's record.
				b := rec.LeaseUntil
				if r.IntN(2) == 0 {
					b = rec.ExpiresAt
				}
				if b.After(m.now) {
					d = b.Sub(m.now)
				}
			}
			what = fmt.Sprintf("advance %v", d)
			c.Advance(d)
			m.now = m.now.Add(d)
		case 10:
			bc, ok := s.(store.BatchClaimer)
			if !ok {
				continue
			}
			n := 1 + r.IntN(4)
			reqs := make([]store.ClaimRequest, n)
			for i := range reqs {
				reqs[i] = claimReq(keys[r.IntN(len(keys))], step)
			}
			what = fmt.Sprintf("ClaimBatch(%+v)", reqs)
			out, err := bc.ClaimBatch(ctx, reqs)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if len(out) != n {
				t.Fatalf("%s: %d results", what, len(out))
			}
			for i, req := range reqs {
				if out[i].Err != nil {
					t.Fatalf("%s: [%d]: %v", what, i, out[i].Err)
				}
				m.claimed(fmt.Sprintf("%s [%d]", what, i), req, out[i])
			}
		case 11:
			bf, ok := s.(store.BatchFinisher)
			if !ok {
				continue
			}
			n := 1 + r.IntN(4)
			cs := make([]store.FinishRequest, n)
			for i := range cs {
				k := keys[r.IntN(len(keys))]
				f, id := attemptOf(k)
				cs[i] = store.FinishRequest{Key: k, Fence: f, AttemptID: id, Outcome: store.OutcomeCompleted,
					Result: []byte(fmt.Sprint("batch-", step, "-", i)), Retention: pick(time.Minute, time.Hour)}
				if r.IntN(4) == 0 {
					cs[i].Outcome, cs[i].Result, cs[i].Reason = []store.Outcome{store.OutcomeFailed, store.OutcomeReleased, store.OutcomeAbandoned}[r.IntN(3)], nil, "batch"
				}
			}
			what = fmt.Sprintf("FinishBatch(%+v)", cs)
			errs, err := bf.FinishBatch(ctx, cs)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if len(errs) != n {
				t.Fatalf("%s: %d errors", what, len(errs))
			}
			for i, c := range cs {
				next, merr := applyFinish(m.records[c.Key], c, m.now)
				got := errs[i]
				if errors.Is(got, store.ErrNotFound) {
					got = idem.ErrLeaseLost // BatchFinisher allows either
				}
				m.sameErr(fmt.Sprintf("%s [%d]", what, i), got, merr)
				if next != nil {
					m.records[c.Key] = next
				}
			}
		case 12:
			what = fmt.Sprintf("Delete(%s)", key)
			err := s.Delete(ctx, key)
			rec := m.records[key]
			var merr error
			if rec == nil || rec.Expired(m.now) {
				merr = store.ErrNotFound
			} else {
				delete(m.records, key)
			}
			m.sameErr(what, err, merr)
		case 13:
			if !c.Sweep {
				continue
			}
			what = "Sweep"
			n, err := s.Sweep(ctx, 100)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			want := 0
			for k, rec := range m.records {
				if rec.Expired(m.now) {
					want++
					delete(m.records, k)
				}
			}
			if n != want {
				t.Fatalf("Sweep deleted %d, model %d", n, want)
			}
		case 14:
			q := store.ListQuery{}
			switch r.IntN(4) {
			case 1:
				q.Stuck = true
			case 2:
				q.Status = idem.StatusInProgress
			case 3:
				q.Status = idem.StatusReleased
			}
			if r.IntN(3) == 0 {
				q.After = "a"
			}
			what = fmt.Sprintf("List(%+v)", q)
			got, err := s.List(ctx, q)
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			var gk, wk []string
			for _, rec := range got {
				gk = append(gk, rec.Key)
			}
			for _, k := range keys {
				rec := m.records[k]
				if rec == nil || rec.Expired(m.now) || k <= q.After ||
					q.Status != "" && rec.Status != q.Status || q.Stuck && !rec.Lapsed(m.now) {
					continue
				}
				wk = append(wk, k)
			}
			if !slices.Equal(gk, wk) {
				t.Fatalf("%s = %v, model %v", what, gk, wk)
			}
		}
		for _, k := range keys {
			m.check(what, k)
		}
	}
}

func (m *model) claimed(what string, req store.ClaimRequest, cr store.ClaimResult) {
	m.t.Helper()
	prev := m.records[req.Key]
	next, want := store.ApplyClaim(prev, req, m.now, 0)
	if next != nil && prev == nil && cr.Acquired {
		// A new record's first fence is the store's clock (or its floor):
		// at least the model's clock, which does not run on with the
		// store's. The model takes the store's.
		if cr.Record.Fence < next.Fence {
			m.t.Fatalf("%s: a new record's fence %d is below the clock's %d", what, cr.Record.Fence, next.Fence)
		}
		next.Fence = cr.Record.Fence
		next.Journal[len(next.Journal)-1].Fence = cr.Record.Fence
		want.Record = *next
	}
	if next != nil {
		m.records[req.Key] = next
	}
	if cr.Acquired != want.Acquired || cr.Takeover != want.Takeover {
		m.t.Fatalf("%s: acquired %v takeover %v, model %v %v", what, cr.Acquired, cr.Takeover, want.Acquired, want.Takeover)
	}
	m.sameTime(what+" Now", cr.Now, m.now)
	if want.Acquired || !want.Record.Expired(m.now) {
		m.sameRecord(what, cr.Record, want.Record)
	}
}

func (m *model) finish(what string, req store.FinishRequest, err error) {
	m.t.Helper()
	next, merr := applyFinish(m.records[req.Key], req, m.now)
	m.sameErr(what, err, merr)
	if next != nil {
		m.records[req.Key] = next
	}
}

// applyFinish is store.ApplyFinish behind the check every store makes
// first: a request it must refuse (an empty attempt id, as an abandoned
// record's) is ErrInvalid and changes nothing.
func applyFinish(rec *store.Record, req store.FinishRequest, now time.Time) (*store.Record, error) {
	if err := req.Check(); err != nil {
		return nil, store.ErrInvalid
	}
	return store.ApplyFinish(rec, req, now)
}

// applyExtend is store.ApplyExtend behind the store's check, as applyFinish.
func applyExtend(rec *store.Record, req store.ExtendRequest, now time.Time) (*store.Record, error) {
	if err := req.Check(); err != nil {
		return nil, store.ErrInvalid
	}
	return store.ApplyExtend(rec, req, now)
}

func (m *model) sameErr(what string, got, want error) {
	m.t.Helper()
	if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
		m.t.Fatalf("%s: err %v, model %v", what, got, want)
	}
}

func (m *model) check(what, key string) {
	m.t.Helper()
	got, err := m.c.Store.Get(context.Background(), key)
	want := m.records[key]
	if want == nil || want.Expired(m.now) {
		if !errors.Is(err, store.ErrNotFound) {
			m.t.Fatalf("after %s: Get(%s) = %v, %v; model: absent", what, key, got.Status, err)
		}
		return
	}
	if err != nil {
		m.t.Fatalf("after %s: Get(%s): %v", what, key, err)
	}
	m.sameRecord("after "+what+": "+key, got, *want)
}

// sameTime allows a store whose clock runs on to be ahead of the model by
// the real time the test took.
func (m *model) sameTime(what string, got, want time.Time) {
	m.t.Helper()
	if got.IsZero() != want.IsZero() {
		m.t.Fatalf("%s: time %v, model %v", what, got, want)
	}
	d := got.Sub(want)
	if m.c.Exact {
		if d != 0 {
			m.t.Fatalf("%s: time %v, model %v (off by %v)", what, got, want, d)
		}
		return
	}
	if d < -time.Millisecond || d > time.Since(m.start)+time.Second {
		m.t.Fatalf("%s: time %v, model %v (off by %v)", what, got, want, d)
	}
}

func (m *model) sameRecord(what string, got, want idem.Record) {
	m.t.Helper()
	if got.Key != want.Key || got.Status != want.Status || got.Policy != want.Policy || got.Fence != want.Fence || got.AttemptID != want.AttemptID ||
		got.Attempt != want.Attempt || got.Owner != want.Owner || got.Fingerprint != want.Fingerprint ||
		string(got.Result) != string(want.Result) || got.Reason != want.Reason || len(got.Journal) != len(want.Journal) {
		g, w := got, want
		g.Journal, w.Journal = nil, nil
		m.t.Fatalf("%s:\n got   %+v\n model %+v", what, g, w)
	}
	for _, p := range []struct {
		n    string
		g, w time.Time
	}{{"LeaseUntil", got.LeaseUntil, want.LeaseUntil}, {"ExpiresAt", got.ExpiresAt, want.ExpiresAt},
		{"CreatedAt", got.CreatedAt, want.CreatedAt}, {"UpdatedAt", got.UpdatedAt, want.UpdatedAt}} {
		m.sameTime(what+" "+p.n, p.g, p.w)
	}
	for i := range got.Journal {
		g, w := got.Journal[i], want.Journal[i]
		jw := fmt.Sprintf("%s: journal[%d]", what, i)
		m.sameTime(jw+" Started", g.Started, w.Started)
		m.sameTime(jw+" LeaseUntil", g.LeaseUntil, w.LeaseUntil)
		m.sameTime(jw+" Ended", g.Ended, w.Ended)
		m.sameTime(jw+" LateFinish", g.LateFinish, w.LateFinish)
		g.Started, g.LeaseUntil, g.Ended, g.LateFinish = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		w.Started, w.LeaseUntil, w.Ended, w.LateFinish = time.Time{}, time.Time{}, time.Time{}, time.Time{}
		if g != w {
			m.t.Fatalf("%s:\n got   %+v\n model %+v", jw, g, w)
		}
	}
}
