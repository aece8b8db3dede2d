package sqsqueue

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/sqs"
	"github.com/aws/aws-sdk-go-v2/service/sqs/types"

	"github.com/idemkit/idem/queue"
)

// deleter sends deletes by group commit: a delete that finds none in flight
// is sent at once, alone (DeleteMessage); deletes that arrive while one is
// in flight wait for it and then go together, up to 10 per
// DeleteMessageBatch. A lone ack is never delayed; under load the calls
// shrink up to tenfold.
type deleter struct {
	q       *Queue
	mu      sync.Mutex
	busy    bool
	pending []*delReq
	calls   int // DeleteMessage + DeleteMessageBatch calls made (tests)
}

type delReq struct {
	ctx    context.Context
	handle string
	done   chan error
}

// batchEntryError is SQS's refusal of one entry of a DeleteMessageBatch.
type batchEntryError struct {
	code, msg string
}

func (e *batchEntryError) Error() string { return e.code + ": " + e.msg }

func (b *deleter) delete(ctx context.Context, handle string) error {
	return wait(ctx, b.submit(ctx, handle)[0])
}

func wait(ctx context.Context, r *delReq) error {
	select {
	case err := <-r.done:
		return err
	case <-ctx.Done():
		return fmt.Errorf("waiting for the delete (it may still happen): %w", ctx.Err())
	}
}

func (b *deleter) submit(ctx context.Context, handles ...string) []*delReq {
	rs := make([]*delReq, len(handles))
	for i, h := range handles {
		rs[i] = &delReq{ctx: ctx, handle: h, done: make(chan error, 1)}
	}
	b.mu.Lock()
	b.pending = append(b.pending, rs...)
	start := !b.busy
	b.busy = true
	b.mu.Unlock()
	if start {
		go b.run()
	}
	return rs
}

func (b *deleter) run() {
	for {
		b.mu.Lock()
		if len(b.pending) == 0 {
			b.busy = false
			b.mu.Unlock()
			return
		}
		n := min(MaxBatch, len(b.pending))
		batch := slices.Clone(b.pending[:n])
		b.pending = b.pending[n:]
		b.calls++
		b.mu.Unlock()
		b.send(batch)
	}
}

func (b *deleter) send(batch []*delReq) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(batch[0].ctx), b.q.ackTimeout)
	defer cancel()
	if len(batch) == 1 {
		_, err := b.q.client.DeleteMessage(ctx, &sqs.DeleteMessageInput{
			QueueUrl: aws.String(b.q.url), ReceiptHandle: aws.String(batch[0].handle),
		})
		batch[0].done <- err
		return
	}
	entries := make([]types.DeleteMessageBatchRequestEntry, len(batch))
	for i, r := range batch {
		entries[i] = types.DeleteMessageBatchRequestEntry{Id: aws.String(strconv.Itoa(i)), ReceiptHandle: aws.String(r.handle)}
	}
	out, err := b.q.client.DeleteMessageBatch(ctx, &sqs.DeleteMessageBatchInput{QueueUrl: aws.String(b.q.url), Entries: entries})
	if err != nil {
		for _, r := range batch {
			r.done <- err
		}
		return
	}
	answered := make([]bool, len(batch))
	for _, s := range out.Successful {
		if i, err := strconv.Atoi(aws.ToString(s.Id)); err == nil && i >= 0 && i < len(batch) && !answered[i] {
			answered[i] = true
			batch[i].done <- nil
		}
	}
	for _, f := range out.Failed {
		if i, err := strconv.Atoi(aws.ToString(f.Id)); err == nil && i >= 0 && i < len(batch) && !answered[i] {
			answered[i] = true
			var e error = &batchEntryError{code: aws.ToString(f.Code), msg: aws.ToString(f.Message)}
			if aws.ToString(f.Code) == "ReceiptHandleIsInvalid" || isStaleText(aws.ToString(f.Message)) {
				e = fmt.Errorf("%w: %w", ErrStaleReceipt, e)
			}
			batch[i].done <- e
		}
	}
	for i, r := range batch {
		if !answered[i] {
			r.done <- errors.New("DeleteMessageBatch returned no result for this entry")
		}
	}
}

// AckAll acks the deliveries with as few DeleteMessageBatch calls as
// possible (10 per call) and returns the errors of those that failed,
// joined (nil when all were deleted); each error names its message and
// wraps [ErrStaleReceipt] or [queue.ErrSettled] as Ack's would (a delivery
// whose visibility has lapsed is not deleted, as with Ack). Deliveries
// that are not this package's are acked one by one with their own Ack.
func AckAll(ctx context.Context, ds []queue.Delivery) error {
	var errs []error
	var own []*Delivery
	for _, d := range ds {
		if sd, ok := d.(*Delivery); ok {
			own = append(own, sd)
		} else if err := d.Ack(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	// Lock in one global order so two AckAll calls sharing deliveries
	// cannot deadlock (Ack holds one lock only).
	slices.SortFunc(own, func(a, b *Delivery) int {
		return cmp.Or(cmp.Compare(a.q.url, b.q.url), cmp.Compare(a.handle, b.handle))
	})
	own = slices.CompactFunc(own, func(a, b *Delivery) bool { return a == b })
	for _, d := range own {
		d.mu.Lock()
		defer d.mu.Unlock()
	}
	now := time.Now()
	type job struct {
		d *Delivery
		r *delReq
	}
	var jobs []job
	byQueue := map[*Queue][]int{}
	for _, d := range own {
		if err := d.refuse("ack", now); err != nil {
			errs = append(errs, err)
			continue
		}
		byQueue[d.q] = append(byQueue[d.q], len(jobs))
		jobs = append(jobs, job{d: d})
	}
	for q, idx := range byQueue {
		handles := make([]string, len(idx))
		for i, j := range idx {
			handles[i] = jobs[j].d.handle
		}
		for i, r := range q.del.submit(ctx, handles...) {
			jobs[idx[i]].r = r
		}
	}
	for _, j := range jobs {
		if err := wait(ctx, j.r); err != nil {
			errs = append(errs, j.d.sqsErr("ack", err))
			continue
		}
		j.d.settled = true
	}
	return errors.Join(errs...)
}
