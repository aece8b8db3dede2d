// Package testobserve holds a recording idem.Observer for tests.
package testobserve

import (
	"context"
	"fmt"
	"slices"
	"sync"

	"github.com/idemkit/idem"
)

// Recorder is an idem.Observer that keeps every event, and checks that
// each start is ended once, with the context its start returned. Its zero
// value is ready to use; it is safe for concurrent use.
type Recorder struct {
	mu     sync.Mutex
	events []Recorded
	spans  []*span
	faults []string
}

// Recorded is one event and the span it was observed in: the start's own
// for a start and its end, the innermost open one otherwise (0: none).
type Recorded struct {
	idem.Event
	Span, Parent int
}

type span struct {
	id, parent int
	kind       idem.EventKind
	ended      bool
}

type spanKey struct{}

var ends = map[idem.EventKind]idem.EventKind{
	idem.OpEnd: idem.OpStart, idem.DeliveryEnd: idem.DeliveryStart,
	idem.WebhookEnd: idem.WebhookStart, idem.RequestEnd: idem.RequestStart,
}

// Observe records e.
func (r *Recorder) Observe(ctx context.Context, e idem.Event) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	cur, _ := ctx.Value(spanKey{}).(*span)
	parent := 0
	if cur != nil {
		parent = cur.id
	}
	if e.Kind.Starts() {
		s := &span{id: len(r.spans) + 1, parent: parent, kind: e.Kind}
		r.spans = append(r.spans, s)
		r.events = append(r.events, Recorded{Event: e, Span: s.id, Parent: parent})
		return context.WithValue(ctx, spanKey{}, s)
	}
	if start, ok := ends[e.Kind]; ok {
		switch {
		case cur == nil || cur.kind != start:
			r.faults = append(r.faults, fmt.Sprintf("%v observed without its %v's context", e.Kind, start))
		case cur.ended:
			r.faults = append(r.faults, fmt.Sprintf("%v observed twice for span %d", e.Kind, cur.id))
		default:
			cur.ended = true
		}
		if cur != nil {
			parent = cur.parent
			r.events = append(r.events, Recorded{Event: e, Span: cur.id, Parent: parent})
			return ctx
		}
	}
	id := 0
	if cur != nil {
		id = cur.id
	}
	r.events = append(r.events, Recorded{Event: e, Span: id, Parent: parent})
	return ctx
}

// Events returns the events recorded so far.
func (r *Recorder) Events() []Recorded {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.events)
}

// Kinds returns the kinds of the events recorded so far, in order.
func (r *Recorder) Kinds() []idem.EventKind {
	r.mu.Lock()
	defer r.mu.Unlock()
	ks := make([]idem.EventKind, len(r.events))
	for i, e := range r.events {
		ks[i] = e.Kind
	}
	return ks
}

// Last returns the last event of kind k, and whether there was one.
func (r *Recorder) Last(k idem.EventKind) (Recorded, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i := len(r.events) - 1; i >= 0; i-- {
		if r.events[i].Kind == k {
			return r.events[i], true
		}
	}
	return Recorded{}, false
}

// Reset forgets the events recorded so far (and the spans, which must all
// have ended: see Check).
func (r *Recorder) Reset() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.events, r.spans, r.faults = nil, nil, nil
}

// Check returns an error naming every start not ended once with its
// context, and every end without its start's context.
func (r *Recorder) Check() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	faults := slices.Clone(r.faults)
	for _, s := range r.spans {
		if !s.ended {
			faults = append(faults, fmt.Sprintf("%v (span %d) never ended", s.kind, s.id))
		}
	}
	if len(faults) > 0 {
		return fmt.Errorf("%d observer faults: %v", len(faults), faults)
	}
	return nil
}
