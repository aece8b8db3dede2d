package dispatch

import (
	"context"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"
)

// Keep keeps one delivery invisible to other receivers: it extends it
// every [Settings.ExtendEvery], by [Loop.ExtendBy], from the moment the
// loop holds it until Stop. A nil *Keep (the loop does not extend) is
// ready to use: its methods do nothing.
//
// It is a timer, not a goroutine: a delivery waiting its turn costs no
// goroutine, most units end before the first extension is due, and each
// extension runs on its own, so that one the broker answers slowly does
// not delay the others of the batch. An extension may take up to
// ExtendEvery (the next one is due then); Stop cancels one under way, so
// that a broker call that hangs does not hold up the delivery's
// settlement. No extension is made once the context it was started under
// (the loop's work context) is done. An extension that fails is logged
// ([Lines.ExtendFailed]) and the next one made on time.
type Keep[D any] struct {
	l       *Loop[D]
	d       D
	ctx     context.Context // ends the extensions (the loop's work context)
	name    atomic.Pointer[slog.Attr]
	run     sync.Mutex         // held by an extension; Stop waits for it
	mu      sync.Mutex         // guards cancel; Stop and an extension setting t again take it in turn
	cancel  context.CancelFunc // of the extension under way, which Stop cancels; nil between
	stopped atomic.Bool
	until   atomic.Int64 // unix ns after which no extension is made (StopAfter); 0: none
	bound   atomic.Int64 // the duration StopAfter was given, for the log line
	t       *time.Timer
}

// keep starts keeping d invisible under ctx. It returns nil when the loop
// does not extend (ExtendEvery 0 or less).
func (l *Loop[D]) keep(ctx context.Context, d D) *Keep[D] {
	if l.ExtendEvery <= 0 {
		return nil
	}
	// No context of its own: most deliveries are done before their first
	// extension, and a child of the loop's context would take and give
	// back a place among its children (under its lock) for each.
	k := &Keep[D]{l: l, d: d, ctx: ctx}
	k.run.Lock() // a first extension waits for t
	k.t = time.AfterFunc(l.ExtendEvery, k.extend)
	k.run.Unlock()
	return k
}

// Name adds a to the log lines of the delivery's failed extensions, before
// [Loop.Attrs]: the operation key, say, once the processing has computed
// it (a delivery waiting its turn has none yet).
func (k *Keep[D]) Name(a slog.Attr) {
	if k != nil {
		k.name.Store(&a)
	}
}

// StopAfter bounds the extensions: none is made once d has passed, as if
// Stop had been called then (without waiting for anything). For work that
// may outlive its own timeout (a call that ignores its context): the
// delivery's visibility then lapses and another receiver can take it,
// rather than the delivery staying held for as long as the call hangs.
// The first extension due past the bound logs [Lines.ExtendBounded].
func (k *Keep[D]) StopAfter(d time.Duration) {
	if k != nil {
		k.bound.Store(int64(d))
		k.until.Store(time.Now().Add(d).UnixNano())
	}
}

func (k *Keep[D]) extend() {
	k.run.Lock()
	defer k.run.Unlock()
	if k.stopped.Load() || k.ctx.Err() != nil {
		return
	}
	l := k.l
	if u := k.until.Load(); u != 0 && time.Now().UnixNano() > u {
		// Bounded by StopAfter: no more extensions (the timer is not set
		// again, so this is said once).
		if l.Lines.ExtendBounded != "" {
			attrs := k.attrs()
			attrs = append(attrs, slog.Duration("bound", time.Duration(k.bound.Load())))
			l.Log.LogAttrs(k.ctx, slog.LevelWarn, l.Lines.ExtendBounded, attrs...)
		}
		return
	}
	asked := time.Now()
	k.mu.Lock()
	if k.stopped.Load() {
		k.mu.Unlock()
		return
	}
	ectx, cancel := context.WithTimeout(k.ctx, l.ExtendEvery)
	k.cancel = cancel
	k.mu.Unlock()
	err := l.Extend(ectx, k.d, l.ExtendBy)
	k.mu.Lock() // Stop, which stops the timer under mu, comes before or after
	k.cancel = nil
	stopped := k.stopped.Load()
	if !stopped {
		k.t.Reset(max(l.ExtendEvery-time.Since(asked), 0))
	}
	k.mu.Unlock()
	cancel()
	if err != nil && !stopped && k.ctx.Err() == nil {
		attrs := append(k.attrs(), slog.Any("error", err))
		l.Log.LogAttrs(k.ctx, slog.LevelWarn, l.Lines.ExtendFailed, attrs...)
	}
}

// attrs identifies the delivery in the Keep's log lines: its name, then
// [Loop.Attrs].
func (k *Keep[D]) attrs() []slog.Attr {
	var attrs []slog.Attr
	if a := k.name.Load(); a != nil {
		attrs = append(attrs, *a)
	}
	if k.l.Attrs != nil {
		attrs = append(attrs, k.l.Attrs(k.d)...)
	}
	return attrs
}

// Stop ends the extensions, and waits for one under way (cancelled) to
// return: none follows. It may be called more than once.
func (k *Keep[D]) Stop() {
	if k == nil {
		return
	}
	k.mu.Lock()
	k.stopped.Store(true)
	k.t.Stop()
	if k.cancel != nil {
		k.cancel() // an extension under way gives up
	}
	k.mu.Unlock()
	k.run.Lock() // and finishes first
	k.run.Unlock()
}
