package idem

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// batcher sends the requests of concurrent callers to the store together
// (see [WithCoalescing]). A call made while fewer than flights batches are
// in flight is sent at once, with the calls waiting before it; a call made
// while every flight is busy waits for the next batch. When a batch's
// answer comes back and calls are waiting, the next batch leaves at once.
// There is no timer: batches grow with the load and only with it.
type batcher[Req, Res any] struct {
	size    int
	flights int
	// bound limits a batch's store call when one of its callers' contexts
	// has no deadline (callers that leave do not cancel it: others share it).
	bound func(reqs []Req) time.Duration
	// one sends a lone request, many a batch; many returns one Res per
	// request or an error.
	one  func(ctx context.Context, r Req) (Res, error)
	many func(ctx context.Context, rs []Req) ([]Res, error)
	// orphan is told of the answer to a call whose caller left after the
	// call was sent (a claim acquired for nobody is released).
	orphan func(r Req, res Res)

	mu    sync.Mutex
	busy  int
	queue []*batchCall[Req, Res]
}

type batchCall[Req, Res any] struct {
	ctx      context.Context
	req      Req
	res      Res
	err      error
	sent     bool // in a batch on its way (under batcher.mu)
	answered bool // res and err are set (under batcher.mu)
	gone     bool // the caller left before the answer (under batcher.mu)
	done     chan struct{}
}

// do sends r, alone or with other callers' requests, and returns its answer.
// If ctx ends first, do returns ctx's error; the request, if already sent,
// is answered to orphan.
func (b *batcher[Req, Res]) do(ctx context.Context, r Req) (Res, error) {
	b.mu.Lock()
	if b.busy < b.flights && len(b.queue) == 0 {
		// Nothing waits and a flight is free: the caller sends its own
		// request on its own context, as without coalescing.
		b.busy++
		b.mu.Unlock()
		defer b.land() // even if the store panics: the flight must come back
		return b.one(ctx, r)
	}
	// Every flight is busy (calls wait only then): the next flight to
	// land takes this call in its batch.
	call := &batchCall[Req, Res]{ctx: ctx, req: r, done: make(chan struct{})}
	b.queue = append(b.queue, call)
	b.mu.Unlock()
	select {
	case <-call.done:
		return call.res, call.err
	case <-ctx.Done():
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	switch {
	case call.answered:
		return call.res, call.err
	case !call.sent:
		for i, c := range b.queue {
			if c == call {
				b.queue = append(b.queue[:i], b.queue[i+1:]...)
				break
			}
		}
	default:
		call.gone = true
	}
	var zero Res
	return zero, context.Cause(ctx)
}

// take removes the next batch from the queue. b.mu is held.
func (b *batcher[Req, Res]) take() []*batchCall[Req, Res] {
	n := min(len(b.queue), b.size)
	batch := make([]*batchCall[Req, Res], n)
	copy(batch, b.queue)
	for _, c := range batch {
		c.sent = true
	}
	rest := copy(b.queue, b.queue[n:])
	clear(b.queue[rest:])
	b.queue = b.queue[:rest]
	return batch
}

// land ends a flight: the next batch, if calls wait, takes it over.
func (b *batcher[Req, Res]) land() {
	b.mu.Lock()
	if len(b.queue) == 0 {
		b.busy--
		b.mu.Unlock()
		return
	}
	next := b.take()
	b.mu.Unlock()
	go b.flush(next)
}

// flush sends batch, answers its callers and lands the flight.
func (b *batcher[Req, Res]) flush(batch []*batchCall[Req, Res]) {
	reqs := make([]Req, len(batch))
	for i, c := range batch {
		reqs[i] = c.req
	}
	res, err := b.send(batch, reqs)
	var orphans []int
	b.mu.Lock()
	for i, c := range batch {
		if err != nil {
			c.err = err
		} else {
			c.res = res[i]
		}
		c.answered = true
		if c.gone && err == nil {
			orphans = append(orphans, i)
		}
		close(c.done)
	}
	b.mu.Unlock()
	b.land()
	// Orphans are answered after the flight landed: releasing them must
	// not hold up the calls waiting for it.
	for _, i := range orphans {
		b.orphan(reqs[i], res[i])
	}
}

// send makes the batch's store call. A panic in the store is every
// caller's error (the flight's goroutine is not a caller's, so the panic
// cannot be raised where someone would recover it).
func (b *batcher[Req, Res]) send(batch []*batchCall[Req, Res], reqs []Req) (res []Res, err error) {
	ctx, cancel := b.context(batch, reqs)
	defer cancel()
	defer func() {
		if p := recover(); p != nil {
			res, err = nil, fmt.Errorf("the store panicked: %v", p)
		}
	}()
	if len(reqs) == 1 {
		r, err := b.one(ctx, reqs[0])
		return []Res{r}, err
	}
	res, err = b.many(ctx, reqs)
	if err == nil && len(res) != len(reqs) {
		err = fmt.Errorf("the store answered %d of a batch of %d (a store bug)", len(res), len(reqs))
	}
	return res, err
}

// context is the context of a batch's store call: the first caller's
// values, no cancellation (a caller that leaves must not fail the others),
// and the latest of the callers' deadlines, or bound when one has none.
func (b *batcher[Req, Res]) context(batch []*batchCall[Req, Res], reqs []Req) (context.Context, context.CancelFunc) {
	var latest time.Time
	for _, c := range batch {
		d, ok := c.ctx.Deadline()
		if !ok {
			latest = time.Now().Add(b.bound(reqs))
			break
		}
		if d.After(latest) {
			latest = d
		}
	}
	return context.WithDeadline(context.WithoutCancel(batch[0].ctx), latest)
}
