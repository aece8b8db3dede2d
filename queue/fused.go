package queue

import (
	"context"
	"log/slog"
	"sync/atomic"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store"
)

// ClaimingSource is a [Source] that lives in the database of a ledger's
// store and can claim the operation keys of the messages it hands out in
// the same transaction as the receive, and record a handled message's
// completion in the same commit as its ack (queue/sqlqueue made with
// sqlqueue.WithLedger). A [Consumer] whose ledger is on that store uses
// it by itself (see [Consumer]): a message then costs one commit fewer
// for its claim and one for its ack, shared with the other messages of
// its batch.
type ClaimingSource interface {
	Source
	// ClaimsFor reports whether the source can claim keys on s: it was
	// made with s as its ledger store.
	ClaimsFor(s store.Store) bool
	// ReceiveClaimed is Receive that also claims, in the receive's
	// transaction, the key of each message for which claim returns a
	// request (ok false: none, the consumer handles the message as from
	// Receive). claims[i] is ds[i]'s claim, or nil. The deliveries and
	// claims commit together or not at all: on an error neither is
	// handed out. A claim's Complete, when set, records the completion
	// and the ack in one commit; the delivery's Ack then only reports it.
	ReceiveClaimed(ctx context.Context, max int, claim func(Message) (store.ClaimRequest, bool)) (ds []Delivery, claims []*idem.Claimed, err error)
}

// fusedDelivery is a delivery a [ClaimingSource] handed out with its key
// already claimed: the consumer's preparation of the message (key,
// decoded handler call, options) done at the receive, and the claim.
type fusedDelivery struct {
	Delivery
	key     idem.OperationKey
	run     func(context.Context) ([]byte, error)
	opts    []idem.CallOption
	claimed *idem.Claimed
	used    atomic.Bool // handed to the ledger, which now owns the claim
}

// fusedSource returns src as a ClaimingSource that claims on the
// consumer's ledger's store, or nil.
func (c *Consumer) fusedSource(src Source) ClaimingSource {
	cs, ok := src.(ClaimingSource)
	if !ok || !cs.ClaimsFor(c.ledger.Store()) {
		return nil
	}
	return cs
}

// receiveFused receives through cs, claiming the keys of the messages the
// consumer will run: not those it cannot key (dead-lettered by process)
// nor those over their receives (process asks the ledger first).
func (c *Consumer) receiveFused(cs ClaimingSource) func(ctx context.Context, max int) ([]Delivery, error) {
	return func(ctx context.Context, max int) ([]Delivery, error) {
		type prep struct {
			key  idem.OperationKey
			run  func(context.Context) ([]byte, error)
			opts []idem.CallOption
		}
		var preps map[string]prep
		ds, claims, err := cs.ReceiveClaimed(ctx, max, func(m Message) (store.ClaimRequest, bool) {
			if c.cfg.maxReceives > 0 && m.ReceiveCount > c.cfg.maxReceives {
				return store.ClaimRequest{}, false
			}
			key, run, opts, err := c.prepare(m)
			if err != nil {
				return store.ClaimRequest{}, false
			}
			req, err := c.ledger.ClaimRequest(key, opts...)
			if err != nil {
				return store.ClaimRequest{}, false
			}
			if preps == nil {
				preps = make(map[string]prep, max)
			}
			preps[m.ID] = prep{key, run, opts}
			return req, true
		})
		for i, d := range ds {
			if i >= len(claims) || claims[i] == nil {
				continue
			}
			p, ok := preps[d.Message().ID]
			if !ok {
				continue // not reached: the source claimed only what the callback asked for
			}
			ds[i] = &fusedDelivery{Delivery: d, key: p.key, run: p.run, opts: p.opts, claimed: claims[i]}
		}
		return ds, err
	}
}

// prepared returns what process needs for d: for a delivery with a claim,
// what the receive prepared, and the claim as a call option.
func (c *Consumer) prepared(d Delivery) (key idem.OperationKey, run func(context.Context) ([]byte, error), opts []idem.CallOption, err error) {
	if fd, ok := d.(*fusedDelivery); ok && fd.used.CompareAndSwap(false, true) {
		opts = append(fd.opts[:len(fd.opts):len(fd.opts)], idem.WithClaimed(fd.claimed))
		return fd.key, fd.run, opts, nil
	}
	return c.prepare(d.Message())
}

// undoUnused ends the claim of a fused delivery handed back before its
// handler ran (the consumer is stopping, or an earlier message of its
// group was not done): fn never ran, so the claim is undone
// ([store.UndoClaim]: released, or a takeover abandoned), and the
// message's next delivery finds the key as it was.
func (c *Consumer) undoUnused(d Delivery) {
	fd, ok := d.(*fusedDelivery)
	if !ok || !fd.used.CompareAndSwap(false, true) || !fd.claimed.Result.Acquired {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), c.ledger.FinishTimeout())
	defer cancel()
	if err := store.UndoClaim(ctx, c.ledger.Store(), fd.claimed.Result, "the message was handed back before its handler ran"); err != nil {
		c.log.LogAttrs(ctx, slog.LevelWarn, "queue: undoing the claim of a message handed back failed; its key waits for its lease",
			c.ledger.LogKey(fd.key.String()), slog.String("message_id", fd.Message().ID), slog.Any("error", err))
	}
}
