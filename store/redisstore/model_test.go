package redisstore

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/internal/transition"
)

// TestModel runs random operations on a few keys against the store and
// against internal/transition (the rules every store implements), and
// compares every answer and every record. The model's clock is the
// store's clock at the start plus the test's advances; the store's runs
// ahead of it by the real time the test takes, so durations and advances
// are whole minutes, far from the boundaries that real time could cross.
func TestModel(t *testing.T) {
	testURL(t)
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			t.Parallel()
			runModel(t, seed, 300)
		})
	}
}

type model struct {
	t       *testing.T
	s       *Store
	clocks  *testClocks
	now     time.Time // the model's clock
	start   time.Time // real time at the start, to bound the drift
	records map[string]*idem.Record
}

func runModel(t *testing.T, seed uint64, steps int) {
	clocks := new(testClocks)
	s := newTestStore(t, clocks)
	ctx := context.Background()
	m := &model{t: t, s: s, clocks: clocks, records: map[string]*idem.Record{}, start: time.Now()}
	var err error
	if m.now, err = s.Now(ctx); err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(seed, seed*7+1))
	keys := []string{"a", "b", "c"}
	pick := func(xs ...time.Duration) time.Duration { return xs[r.IntN(len(xs))] }
	for step := range steps {
		key := keys[r.IntN(len(keys))]
		rec := m.records[key]
		fence := int64(1)
		if rec != nil {
			fence = rec.Fence + int64(r.IntN(3)) - 1 // the holder's, a stale one, a future one
		}
		what := ""
		switch op := r.IntN(10); op {
		case 0, 1, 2:
			req := idem.ClaimRequest{
				Key: key, Owner: fmt.Sprintf("w%d", r.IntN(3)), Correlation: fmt.Sprintf("c%d", step),
				Policy: idem.Policy(r.IntN(2)), TakeLapsed: r.IntN(4) == 0,
				Lease:     pick(time.Minute, 2*time.Minute, 10*time.Minute),
				Retention: pick(time.Minute, 5*time.Minute, time.Hour),
			}
			if r.IntN(2) == 0 {
				req.Fingerprint = fmt.Sprint("fp", r.IntN(2))
			}
			what = fmt.Sprintf("Claim(%+v)", req)
			m.claim(what, req)
		case 3:
			res := []byte(fmt.Sprint("result-", step))
			ret := pick(time.Minute, time.Hour)
			what = fmt.Sprintf("Complete(%s, %d, %v)", key, fence, ret)
			m.finish(what, key, fence, transition.Ending{Status: idem.StatusCompleted, Result: res, Retention: ret},
				s.Complete(ctx, key, fence, res, ret))
		case 4:
			ret := pick(time.Minute, time.Hour)
			what = fmt.Sprintf("Fail(%s, %d)", key, fence)
			m.finish(what, key, fence, transition.Ending{Status: idem.StatusFailed, Reason: "failed", Retention: ret},
				s.Fail(ctx, key, fence, "failed", ret))
		case 5:
			what = fmt.Sprintf("Release(%s, %d)", key, fence)
			m.finish(what, key, fence, transition.Ending{Status: idem.StatusReleased, Reason: "released"},
				s.Release(ctx, key, fence, "released"))
		case 6:
			what = fmt.Sprintf("Abandon(%s, %d)", key, fence)
			m.finish(what, key, fence, transition.Ending{Status: idem.StatusInProgress, Reason: "abandoned"},
				s.Abandon(ctx, key, fence, "abandoned"))
		case 7:
			lease := pick(time.Minute, 3*time.Minute, 2*time.Hour)
			what = fmt.Sprintf("Extend(%s, %d, %v)", key, fence, lease)
			until, err := s.Extend(ctx, key, fence, lease)
			next, merr := transition.Extend(m.records[key], fence, lease, m.now)
			m.sameErr(what, err, merr)
			if next != nil {
				m.records[key] = next
			}
			if err == nil {
				m.sameTime(what+" lease", until, next.LeaseUntil)
			}
		case 8:
			res := idem.Resolution{Done: r.IntN(2) == 0, Result: []byte("resolved"), Reason: "op says", By: fmt.Sprint("op", r.IntN(2)), InProgress: r.IntN(2) == 0}
			if r.IntN(2) == 0 {
				res.Retention = 10 * time.Minute
			}
			f := int64(0)
			if r.IntN(2) == 0 {
				f = fence
			}
			what = fmt.Sprintf("Resolve(%s, %d, %+v)", key, f, res)
			got, err := s.Resolve(ctx, key, f, res)
			next, merr := transition.Resolve(m.records[key], f, res, m.now)
			m.sameErr(what, err, merr)
			if merr == nil {
				m.records[key] = next
				m.sameRecord(what, got, *next)
			}
		case 9:
			d := pick(0, time.Minute, 2*time.Minute, 5*time.Minute, 30*time.Minute, 61*time.Minute)
			what = fmt.Sprintf("advance %v", d)
			clocks.advance(t, d)
			m.now = m.now.Add(d)
		}
		for _, k := range keys {
			m.check(what, k)
		}
	}
	if time.Since(m.start) > 30*time.Second {
		t.Fatalf("the test took %v: real time may have crossed the model's boundaries", time.Since(m.start))
	}
}

func (m *model) claim(what string, req idem.ClaimRequest) {
	cr, err := m.s.Claim(context.Background(), req)
	if err != nil {
		m.t.Fatalf("%s: %v", what, err)
	}
	next, want := transition.Claim(m.records[req.Key], req, m.now)
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

func (m *model) finish(what, key string, fence int64, end transition.Ending, err error) {
	next, merr := transition.Finish(m.records[key], fence, end, m.now)
	m.sameErr(what, err, merr)
	if next != nil {
		m.records[key] = next
	}
}

func (m *model) sameErr(what string, got, want error) {
	m.t.Helper()
	if (got == nil) != (want == nil) || (want != nil && !errors.Is(got, want)) {
		m.t.Fatalf("%s: err %v, model %v", what, got, want)
	}
}

func (m *model) check(what, key string) {
	m.t.Helper()
	got, err := m.s.Get(context.Background(), key)
	want := m.records[key]
	if want == nil || want.Expired(m.now) {
		if !errors.Is(err, idem.ErrNotFound) {
			m.t.Fatalf("after %s: Get(%s) = %v, %v; model: absent", what, key, got.Status, err)
		}
		return
	}
	if err != nil {
		m.t.Fatalf("after %s: Get(%s): %v", what, key, err)
	}
	m.sameRecord("after "+what+": "+key, got, *want)
	checkJournal(m.t, m.s, key)
}

// sameTime allows the store's clock to run ahead of the model's by the
// real time the test took.
func (m *model) sameTime(what string, got, want time.Time) {
	m.t.Helper()
	if got.IsZero() != want.IsZero() {
		m.t.Fatalf("%s: time %v, model %v", what, got, want)
	}
	if d := got.Sub(want); d < -time.Millisecond || d > time.Since(m.start)+time.Second {
		m.t.Fatalf("%s: time %v, model %v (off by %v)", what, got, want, d)
	}
}

func (m *model) sameRecord(what string, got, want idem.Record) {
	m.t.Helper()
	if got.Key != want.Key || got.Status != want.Status || got.Policy != want.Policy || got.Fence != want.Fence ||
		got.Attempt != want.Attempt || got.Owner != want.Owner || got.Fingerprint != want.Fingerprint ||
		string(got.Result) != string(want.Result) || got.Reason != want.Reason || len(got.Journal) != len(want.Journal) {
		m.t.Fatalf("%s:\n got   %+v\n model %+v", what, brief(got), brief(want))
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

func brief(r idem.Record) idem.Record {
	r.Journal = nil
	return r
}
