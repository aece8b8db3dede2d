// Package dispatch is the receive-and-process machinery that queue.Consumer
// and outbox.Relay share: a receive loop that asks a source for as many
// deliveries as it has free slots, splits each batch into units of work
// by FIFO group, keeps every delivery it holds invisible until it is
// settled, processes a unit's deliveries in order, and shuts down
// gracefully. What a delivery's processing is, how it is settled and
// logged, belongs to the user of the loop.
package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// Loop receives deliveries of type D and processes them. Its fields are
// set once, before the first call, and not changed after; a Loop may be
// copied (to process one batch with another Process, say). Every callback
// but Attrs is required.
//
// A unit of work is a delivery without a group, or the deliveries of one
// FIFO group in one batch, in batch order. A unit takes one slot of
// [Settings.Concurrency]; its deliveries are processed one after another,
// each only once the one before is done (Process returned true). Once one
// is not done, or the loop is stopping, the rest of the unit are handed
// back (HandBack), in order, and other units go on.
//
// Every delivery is kept invisible (see [Keep]) from the moment the loop
// holds it until it is settled: while it is processed, and while it waits
// for a free slot (a batch larger than the concurrency, a source that
// returned more than asked) or behind the earlier deliveries of its
// group. Process stops its delivery's Keep before it settles it; the loop
// stops the Keep of every delivery it hands back, and every Keep of a
// unit when the unit ends, also when Process ends its goroutine
// (runtime.Goexit).
type Loop[D any] struct {
	Settings

	// ExtendBy is how long each extension keeps a delivery invisible (see
	// [Extension]).
	ExtendBy time.Duration
	// FillWait is how long [Loop.Run], holding fewer free slots than half
	// a batch, waits for more to free up before it receives: under load, a
	// receive of one delivery per freed slot costs a broker round trip per
	// delivery. 0: it receives at once for the slots free now.
	FillWait time.Duration

	// Log takes the loop's own lines (Lines); it must not be nil.
	Log   *slog.Logger
	Lines Lines

	// Receive asks the source for at most max deliveries, blocking until
	// there is one or ctx is done (see queue.Source).
	Receive func(ctx context.Context, max int) ([]D, error)
	// Group returns d's FIFO group, "" when it has none.
	Group func(d D) string
	// Extend keeps d invisible for by from now.
	Extend func(ctx context.Context, d D, by time.Duration) error
	// Process processes and settles d under ctx, stopping keep before it
	// settles d, and reports whether d is done (the rest of its unit may
	// go on). ctx is the loop's work context: cancelled at the shutdown
	// timeout of Run, the caller's context in HandleBatch.
	Process func(ctx context.Context, d D, keep *Keep[D]) (done bool)
	// HandBack settles d, not processed, so that it is delivered again at
	// once (Retry(0)), for the reason why. The loop has stopped its Keep.
	HandBack func(ctx context.Context, d D, why HandBackReason)
	// Attrs, when not nil, returns the attributes that identify d in the
	// loop's log lines about it (a failed extension).
	Attrs func(d D) []slog.Attr
}

// Lines are the messages of the lines a [Loop] logs, so that each user
// keeps its own wording. An empty one is not logged where that is said.
type Lines struct {
	// ReceiveFailed is logged at ReceiveFailedLevel, with the error and
	// retry_in, when a receive returns an error and no deliveries.
	ReceiveFailed      string
	ReceiveFailedLevel slog.Level
	// ReceivedDespiteError is logged at error, with the error and the
	// number of messages, when a receive returns an error and deliveries
	// too (which are processed). Empty: not logged.
	ReceivedDespiteError string
	// ShutdownTimeout is logged at warn, with shutdown_timeout, when Run's
	// shutdown timeout passes with units under way: their context is then
	// cancelled.
	ShutdownTimeout string
	// Abandoned is logged at error, with grace, when units still run
	// ShutdownGrace after their context was cancelled: Run returns
	// without them.
	Abandoned string
	// ExtendFailed is logged at warn, with the Keep's name, Attrs and the
	// error, when an extension fails.
	ExtendFailed string
	// ExtendBounded is logged at warn, with the Keep's name, Attrs and
	// the bound, when an extension is due after the bound [Keep.StopAfter]
	// set: the work still runs, and its delivery is no longer extended.
	// Empty: not logged.
	ExtendBounded string
}

// HandBackReason says why a delivery is handed back unprocessed.
type HandBackReason int

const (
	// Stopping: the loop is stopping, and the delivery's unit had not
	// started, or the delivery is the first of its unit not processed.
	Stopping HandBackReason = iota
	// StoppingBehind: the loop stopped while the delivery's unit ran, and
	// an earlier delivery of its group was handed back for it.
	StoppingBehind
	// BehindNotDone: an earlier delivery of its group is not done.
	BehindNotDone
)

// ShutdownGrace is how long [Loop.Run] waits, after cancelling the units
// still under way at the shutdown timeout, for them to return.
const ShutdownGrace = 5 * time.Second

// Run receives and processes deliveries until ctx is done. Then it stops
// receiving, hands back the units waiting for a free slot, lets the units
// under way finish for the shutdown timeout, cancels the work context of
// those still running (their deliveries not processed are handed back),
// waits ShutdownGrace more for them, and returns. A receive error is
// logged and the receive tried again after a backoff; a source that
// returns nothing without waiting is paced (5 ms doubled per empty
// receive, up to 250 ms), so that the loop does not spin.
func (l *Loop[D]) Run(ctx context.Context) {
	wctx, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	slots := make(chan struct{}, l.Concurrency)
	var wg sync.WaitGroup
	failures, empties := 0, 0
receive:
	for ctx.Err() == nil {
		select {
		case slots <- struct{}{}:
		case <-ctx.Done():
			break receive
		}
		n := l.fillSlots(ctx, slots)
		ds, err := l.Receive(ctx, n)
		if err != nil && len(ds) > 0 {
			// The source handed these out: left unsettled, they would
			// wait for their visibility to lapse (forever where there is
			// none). They are processed, or handed back when stopping.
			if l.Lines.ReceivedDespiteError != "" {
				l.Log.LogAttrs(ctx, slog.LevelError, l.Lines.ReceivedDespiteError,
					slog.Any("error", err), slog.Int("messages", len(ds)))
			}
			err = nil
		}
		if err != nil || len(ds) == 0 {
			for range n {
				<-slots
			}
			if ctx.Err() != nil {
				break
			}
			if err != nil {
				failures++
				d := l.Backoff.Delay(failures)
				l.Log.LogAttrs(ctx, l.Lines.ReceiveFailedLevel, l.Lines.ReceiveFailed, slog.Any("error", err), slog.Duration("retry_in", d))
				if !sleep(ctx, d) {
					break
				}
				continue
			}
			empties++
			if !sleep(ctx, emptyPause(empties)) {
				break
			}
			continue
		}
		failures, empties = 0, 0
		units := l.hold(wctx, ds)
		for ; n > len(units); n-- {
			<-slots
		}
		for i, u := range units {
			if i >= n { // a source that returned more than asked: wait for a slot
				select {
				case slots <- struct{}{}:
				case <-ctx.Done():
					for _, u := range units[i:] {
						l.handBack(wctx, u, Stopping)
					}
					break receive
				}
			}
			wg.Add(1)
			go func() {
				defer wg.Done()
				defer func() { <-slots }()
				l.runUnit(ctx, wctx, u)
			}()
		}
	}

	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	timer := time.NewTimer(l.ShutdownTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		l.Log.Warn(l.Lines.ShutdownTimeout, slog.Duration("shutdown_timeout", l.ShutdownTimeout))
		cancelWork()
		// A unit whose Process ignores its cancelled context must not
		// keep Run from returning: its delivery comes back when its
		// visibility lapses.
		grace := time.NewTimer(ShutdownGrace)
		defer grace.Stop()
		select {
		case <-done:
		case <-grace.C:
			l.Log.Error(l.Lines.Abandoned, slog.Duration("grace", ShutdownGrace))
		}
	}
}

// fillSlots takes more free slots after the first, up to the batch size:
// those free now, then, while fewer than half a batch are held, those that
// free up within FillWait. It returns how many slots it holds.
func (l *Loop[D]) fillSlots(ctx context.Context, slots chan struct{}) int {
	n := 1
	want := min(l.BatchSize, l.Concurrency)
	for n < want {
		select {
		case slots <- struct{}{}:
			n++
			continue
		default:
		}
		break
	}
	if l.FillWait <= 0 || n >= (want+1)/2 {
		return n
	}
	t := time.NewTimer(l.FillWait)
	defer t.Stop()
	for n < (want+1)/2 {
		select {
		case slots <- struct{}{}:
			n++
		case <-t.C:
			return n
		case <-ctx.Done():
			return n
		}
	}
	return n
}

// HandleBatch processes deliveries already received (FIFO groups in
// order, at most Concurrency units at once) under ctx, and returns when
// every one is settled. Every delivery is kept invisible from the call
// until it is settled, and none is extended after ctx is done; once ctx is
// done, the deliveries not started are handed back.
func (l *Loop[D]) HandleBatch(ctx context.Context, ds []D) {
	slots := make(chan struct{}, l.Concurrency)
	var wg sync.WaitGroup
	for _, u := range l.hold(ctx, ds) {
		slots <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-slots }()
			l.runUnit(ctx, ctx, u)
		}()
	}
	wg.Wait()
}

// held is a delivery the loop holds, and the extension that keeps it
// invisible until it is settled.
type held[D any] struct {
	d    D
	keep *Keep[D] // nil when the loop does not extend
}

// hold starts keeping every one of ds invisible, under ctx, and splits
// them into units of work: each delivery without a group alone, and each
// FIFO group's deliveries together, in batch order.
//
// A delivery is kept from the moment the loop holds it: unextended, a
// waiting delivery would lapse before its turn, and the broker would hand
// it to another receiver, counting a receive against it and, for a group,
// letting it run before the earlier ones finish. Handing the waiting
// deliveries back instead would count a receive each time too.
func (l *Loop[D]) hold(ctx context.Context, ds []D) [][]held[D] {
	units := make([][]held[D], 0, len(ds))
	var group map[string]int
	for _, d := range ds {
		h := held[D]{d: d, keep: l.keep(ctx, d)}
		g := l.Group(d)
		if g == "" {
			units = append(units, []held[D]{h})
			continue
		}
		if group == nil {
			group = make(map[string]int)
		}
		if i, ok := group[g]; ok {
			units[i] = append(units[i], h)
			continue
		}
		group[g] = len(units)
		units = append(units, []held[D]{h})
	}
	return units
}

// runUnit processes a unit's deliveries in order, under wctx. Once one is
// not done, or runCtx or wctx is done, the rest are handed back.
func (l *Loop[D]) runUnit(runCtx, wctx context.Context, unit []held[D]) {
	defer func() {
		// Also when Process ends its goroutine (runtime.Goexit): the
		// deliveries left are then as after a crash.
		for _, h := range unit {
			h.keep.Stop()
		}
	}()
	for i, h := range unit {
		if runCtx.Err() != nil || wctx.Err() != nil {
			l.handBack(wctx, unit[i:i+1], Stopping)
			l.handBack(wctx, unit[i+1:], StoppingBehind)
			return
		}
		if !l.Process(wctx, h.d, h.keep) {
			l.handBack(wctx, unit[i+1:], BehindNotDone)
			return
		}
	}
}

// handBack hands back deliveries in order, each after stopping its Keep.
func (l *Loop[D]) handBack(ctx context.Context, hs []held[D], why HandBackReason) {
	for _, h := range hs {
		h.keep.Stop()
		l.HandBack(ctx, h.d, why)
	}
}
