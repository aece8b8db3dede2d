package idem

import (
	"context"
	"strconv"
	"time"
)

// An Observer is told what idem did: each operation of the [Ledger], each
// delivery a queue consumer handles, each request the webhook Receiver and
// the httpidem middleware answer, each message the outbox relay forwards.
// Metrics, traces and audit trails are built on it (package
// github.com/idemkit/idem/otelidem implements it with OpenTelemetry); the
// Ledger's own log lines are written whether or not one is attached.
//
// Observe is called synchronously on the operation's goroutine (a
// heartbeat's LeaseExtended and StoreFailed on the heartbeat's timer
// goroutine), so it must be quick and safe for concurrent use. For an
// event whose Kind is a start ([Event.Kind.Starts]), the context Observe
// returns is the one the operation continues with: a tracer returns ctx
// with its span, and the matching end event is observed with that
// context. For every other kind the returned context is ignored; return
// ctx.
//
// With no Observer attached ([WithObserver] unset), nothing is called and
// nothing is allocated. With one attached, an event costs one call and no
// allocation of idem's (Event is passed by value), except the key's hash
// under [WithHashedKeysInLogs], computed once per operation; the httpidem
// middleware's small writer that notes the status answered; and, in the
// webhook Receiver and the middleware, the copy of the request that a new
// context returned by a start requires.
type Observer interface {
	Observe(ctx context.Context, e Event) context.Context
}

// ObserverFunc adapts a function to an [Observer].
type ObserverFunc func(ctx context.Context, e Event) context.Context

// Observe calls f(ctx, e).
func (f ObserverFunc) Observe(ctx context.Context, e Event) context.Context { return f(ctx, e) }

// Observers returns an Observer that passes each event to every one of os
// in order; a start event's context flows from one to the next. Nil
// entries are dropped; with none left it returns nil.
func Observers(os ...Observer) Observer {
	var kept multiObserver
	for _, o := range os {
		if o != nil {
			kept = append(kept, o)
		}
	}
	switch len(kept) {
	case 0:
		return nil
	case 1:
		return kept[0]
	}
	return kept
}

type multiObserver []Observer

func (m multiObserver) Observe(ctx context.Context, e Event) context.Context {
	for _, o := range m {
		if c := o.Observe(ctx, e); c != nil && e.Kind.Starts() {
			ctx = c
		}
	}
	return ctx
}

// EventKind says what an [Event] reports. Each start kind is followed, on
// the same goroutine, by exactly one matching end kind observed with the
// context the start returned.
type EventKind uint8

// The kinds of [Event], grouped by who reports them.
const (
	_ EventKind = iota

	// OpStart: [Ledger.Do] (or [Run], [DoTx]) begins. Key, Policy,
	// Correlation and Started are set.
	OpStart
	// OpEnd: the operation ended. Outcome is one of "executed",
	// "replayed", "reconciled", "busy", "mismatch", "indeterminate",
	// "failed", "released", "lease-lost", "store-error", "abandoned",
	// or "rolled-back" ([DoTx] only); it is the outcome the Ledger's log
	// line for the call names;
	// Fence, Attempt, AttemptID and Takeover describe the attempt where
	// there was one; Err is what Do returned; Duration is how long it
	// took.
	OpEnd
	// LeaseExtended: a heartbeat extended the running attempt's lease to
	// Deadline.
	LeaseExtended
	// LeaseLost: the running attempt lost its key, observed once fn has
	// returned. Reason says how: "refused" (the store refused a
	// heartbeat: another attempt holds the key), "ran-out" (the lease ran
	// out while the store could not be reached) or "taken-over" (the
	// store refused the write that ends the attempt); Err says more.
	LeaseLost
	// StoreFailed: a store call failed: Op names it as [StoreError.Op]
	// does ("claim", "claim-tx", "complete", "release", "fail",
	// "abandon"), or "extend" for a heartbeat's extension (fn goes on;
	// the next beat tries again); Err is the store's error. For every Op
	// but "extend" the operation's OpEnd (Outcome "store-error") follows.
	StoreFailed

	// DeliveryStart: a queue consumer begins handling a delivery.
	// Queue, MessageID, Receives and Attributes (the message's own, where
	// a tracer finds the publisher's trace context) are set.
	DeliveryStart
	// DeliveryEnd: the consumer settled the delivery. Outcome is "acked",
	// "retried" (released for a later receive, after Delay),
	// "dead-lettered" or "handed-back" (returned unhandled: the consumer
	// is stopping, or an earlier message of its FIFO group is not done;
	// no DeliveryStart's handling ran, but one was observed). Reason is,
	// for a dead letter, its cause ("undecodable", "max-receives",
	// "mismatch", "failed", "retried", "indeterminate"), else the outcome
	// the consumer's log line names ("executed", "replayed", "busy", …).
	// Key, Fence, Attempt, AttemptID and Takeover are the ledger's for
	// the message's key: the attempt that ran the handler, else the one
	// the ledger's answer names (AttemptID then empty); zero when there
	// is none (an undecodable message). Err is the broker's refusal of
	// the settlement, if any.
	DeliveryEnd

	// WebhookStart: the webhook Receiver begins a request. Source is the
	// sender's name.
	WebhookStart
	// WebhookEnd: the Receiver answered with Status. Outcome is
	// "captured", "replayed", "handshake" (an authentic handshake,
	// answered without a capture) or "refused" with a Reason: "method",
	// "too-large", "timeout", "unreadable", "signature" (the signature or
	// its signed timestamp), "malformed" (authentic, no usable event id),
	// "busy", "mismatch", "indeterminate", "publish", "store-error",
	// "capture-failed", "misconfigured", "answer-unreadable". Key is the
	// event's operation key once known; Err the capture's error.
	WebhookEnd

	// RequestStart: the httpidem middleware begins a request with an
	// Idempotency-Key. Method and Route (the ServeMux pattern that routed
	// the request to the middleware; empty when the middleware wraps the
	// mux) are set.
	RequestStart
	// RequestEnd: the middleware answered with Status; Outcome as for
	// OpEnd ("released" for a response not recorded), or "refused" for a
	// request refused before its claim (a malformed key, a body too
	// large); Reason is the problem type answered, if any; Key, Fence,
	// Attempt and Takeover the ledger's where known; Err what the ledger
	// returned.
	RequestEnd

	// RelayPublished: the outbox relay forwarded a message (MessageID) to
	// its publisher; Duration is the time since the message was written
	// (the relay's lag; 0 when the outbox does not say), Started when it
	// was written. Queue is the outbox's name, Attributes the message's.
	// The relay has no ledger: it reports to the Observer given by
	// outbox.WithObserver.
	RelayPublished
	// RelayRefused: the publisher refused a message (Err); Reason says
	// what the relay does: "refused" (dead-lettered as refused for good),
	// "max-receives" (dead-lettered, out of receives) or "retried" (after
	// Delay).
	RelayRefused
)

// Starts reports whether k opens an operation whose end is observed later
// with the context the start returned.
func (k EventKind) Starts() bool {
	return k == OpStart || k == DeliveryStart || k == WebhookStart || k == RequestStart
}

var eventKindNames = [...]string{
	OpStart: "op-start", OpEnd: "op-end", LeaseExtended: "lease-extended", LeaseLost: "lease-lost",
	StoreFailed: "store-failed", DeliveryStart: "delivery-start", DeliveryEnd: "delivery-end",
	WebhookStart: "webhook-start", WebhookEnd: "webhook-end", RequestStart: "request-start",
	RequestEnd: "request-end", RelayPublished: "relay-published", RelayRefused: "relay-refused",
}

func (k EventKind) String() string {
	if int(k) < len(eventKindNames) && eventKindNames[k] != "" {
		return eventKindNames[k]
	}
	return "EventKind(" + strconv.Itoa(int(k)) + ")"
}

// An Event is one thing an [Observer] is told. Kind says which fields are
// set; the rest are zero. It holds no reference the observer may keep
// beyond Observe's return except its strings and Err.
type Event struct {
	Kind EventKind

	// Key is the operation key, or its hash when the Ledger hashes keys
	// in logs (KeyHashed then true), so that an observer never exports
	// what the logs would not show.
	Key       string
	KeyHashed bool
	// Outcome and Reason: see each Kind.
	Outcome string
	Reason  string
	Policy  Policy
	// The attempt: its fence, number and id; Takeover when it took over
	// a lapsed attempt.
	Fence     int64
	Attempt   int
	AttemptID string
	Takeover  bool
	// Correlation is the operation's correlation id, as logged.
	Correlation string
	// Op names the store call of a StoreFailed event.
	Op string
	// Err is the error the operation returned or the store gave.
	Err error

	// Started is when the operation began; Duration how long it took (end
	// kinds) or, for RelayPublished, the message's age.
	Started  time.Time
	Duration time.Duration
	// Deadline is the lease's new end (LeaseExtended).
	Deadline time.Time
	// Delay is how long a retried delivery waits before its next receive.
	Delay time.Duration

	// Queue, MessageID, Receives and Attributes describe a delivery or a
	// relayed message. Attributes is the message's own map: read it, do
	// not change it.
	Queue      string
	MessageID  string
	Receives   int
	Attributes map[string]string

	// Source (webhook sender), Method and Route (HTTP), Status (the HTTP
	// status answered).
	Source string
	Method string
	Route  string
	Status int
}

// WithObserver attaches o to the Ledger: it sees every operation, and the
// queue consumers, webhook Receivers and httpidem middleware built on this
// Ledger report to it too (see [Observer]). Several observers combine with
// [Observers]. Default: none.
func WithObserver(o Observer) Option {
	return ledgerOption(func(c *config) { c.observer = o })
}

// Observer returns the Observer attached with [WithObserver], or nil.
func (l *Ledger) Observer() Observer { return l.observer }
