package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
	"time"
)

type loggerKey struct{}

// ContextWithLogger returns a copy of ctx that carries logger: the
// [Ledger], the queue consumers, the webhook Receiver and the httpidem
// middleware write the lines of an operation run under ctx to it rather
// than to the logger they were configured with (a request's logger with
// its request id, a test's logger). A nil logger returns ctx unchanged.
func ContextWithLogger(ctx context.Context, logger *slog.Logger) context.Context {
	if logger == nil {
		return ctx
	}
	return context.WithValue(ctx, loggerKey{}, logger)
}

// LoggerFromContext returns the logger ctx carries ([ContextWithLogger]),
// or fallback when it carries none.
func LoggerFromContext(ctx context.Context, fallback *slog.Logger) *slog.Logger {
	if l, ok := ctx.Value(loggerKey{}).(*slog.Logger); ok {
		return l
	}
	return fallback
}

// logger is the logger of an operation under ctx.
func (l *Ledger) logger(ctx context.Context) *slog.Logger { return LoggerFromContext(ctx, l.log) }

// logOutcome writes the one line a person debugging "two emails, one
// booking" needs: key (or its hash), outcome, fence, attempt (number and
// id), owner and correlation id. outcome is what the call came to: it is
// also the Outcome of the call's OpEnd event (see logNote for the lines
// on the way).
func (l *Ledger) logOutcome(ctx context.Context, level slog.Level, outcome string, c *callConfig, rec Record, extra ...slog.Attr) {
	if o := c.obs; o != nil {
		o.outcome, o.fence, o.attempt, o.attemptID = outcome, rec.Fence, rec.Attempt, rec.AttemptID
	}
	l.logNote(ctx, level, outcome, c, rec, extra...)
}

// logNote writes a line as logOutcome does, for something that happened
// on the call's way (a takeover, a failed heartbeat) and is not what it
// came to. It writes nothing in c: heartbeats call it from their own
// goroutine.
func (l *Ledger) logNote(ctx context.Context, level slog.Level, what string, c *callConfig, rec Record, extra ...slog.Attr) {
	log := l.logger(ctx)
	if !log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8+len(extra))
	attrs = append(attrs, l.keyAttr(rec.Key),
		slog.String("outcome", what),
		slog.Int64("fence", rec.Fence),
		slog.Int("attempt", rec.Attempt),
		slog.String("owner", l.owner),
		slog.String("correlation_id", c.correlation),
		slog.String("policy", c.policy.String()))
	if rec.AttemptID != "" {
		// The attempt's own name, as its journal entry and idem explain
		// show it.
		attrs = append(attrs, slog.String("attempt_id", rec.AttemptID))
	}
	attrs = append(attrs, extra...)
	log.LogAttrs(ctx, level, "idem "+what, attrs...)
}

func (l *Ledger) logTakeover(ctx context.Context, c *callConfig, rec Record) {
	lp := lapsedOf(rec)
	l.logNote(ctx, slog.LevelWarn, "takeover", c, rec,
		slog.Int64("lapsed_fence", lp.Fence),
		slog.Int("lapsed_attempt", lp.Attempt),
		slog.String("lapsed_owner", lp.Owner),
		slog.String("lapsed_correlation_id", lp.Correlation),
		slog.String("msg_detail", "took over a lapsed attempt: it may have done part or all of its effect"))
}

// LogKey returns the log attribute for key as this ledger writes it: "key",
// or "key_hash" (the first 8 bytes of its sha256, hex) with
// [WithHashedKeysInLogs]. A handler that logs its own lines about an
// operation (the email it sent, the charge it made) adds it so that one grep
// finds the ledger's lines and the handler's for a key without the key
// itself reaching the logs; packages that log on the ledger's behalf (queue
// consumers, idem serve) use it for the same reason.
func (l *Ledger) LogKey(key string) slog.Attr { return l.keyAttr(key) }

func (l *Ledger) keyAttr(key string) slog.Attr {
	if l.hashedKeys {
		return slog.String("key_hash", keyHash(key))
	}
	return slog.String("key", key)
}

func keyHash(key string) string {
	sum := sha256.Sum256([]byte(key))
	return hex.EncodeToString(sum[:8])
}

// ObservedKey returns key as this ledger's events carry it in
// [Event.Key], and whether that is its hash ([WithHashedKeysInLogs]):
// what [Ledger.LogKey] logs. Packages that report events about the
// ledger's operations (queue consumers, the webhook Receiver) use it.
func (l *Ledger) ObservedKey(key string) (k string, hashed bool) {
	if l.hashedKeys {
		return keyHash(key), true
	}
	return key, false
}

// storeError logs and wraps an error from the store.
func (l *Ledger) storeError(ctx context.Context, op, key string, c *callConfig, rec Record, err error) error {
	if rec.Key == "" {
		rec.Key = key
	}
	l.observeStoreFailed(ctx, op, c, rec, err)
	l.logOutcome(ctx, slog.LevelError, "store-error", c, rec, slog.String("op", op), slog.Any("error", err))
	return &StoreError{Op: op, Key: key, Err: err}
}

// opEvent is an event about the call c for its key (as observed). An
// Observer is attached (so c.obs is set).
func (l *Ledger) opEvent(kind EventKind, c *callConfig, started time.Time) Event {
	return Event{Kind: kind, Key: c.obs.key, KeyHashed: l.hashedKeys, Policy: c.policy, Correlation: c.correlation, Started: started}
}

// opStart observes the start of the call c for key and returns the
// context the call goes on with. An Observer is attached.
func (l *Ledger) opStart(ctx context.Context, key string, c *callConfig, started time.Time) context.Context {
	c.obs.key, _ = l.ObservedKey(key)
	if next := l.observer.Observe(ctx, l.opEvent(OpStart, c, started)); next != nil {
		return next
	}
	return ctx
}

// opEnd observes the end of the call c, with what logOutcome recorded and
// err, what the call returned. An Observer is attached.
func (l *Ledger) opEnd(ctx context.Context, c *callConfig, started time.Time, err error) {
	e := l.opEvent(OpEnd, c, started)
	o := c.obs
	e.Outcome, e.Fence, e.Attempt, e.AttemptID, e.Takeover = o.outcome, o.fence, o.attempt, o.attemptID, c.takeover
	e.Err, e.Duration = err, time.Since(started)
	l.observer.Observe(ctx, e)
}

// observeStoreFailed reports a store call's failure, if an Observer is
// attached.
func (l *Ledger) observeStoreFailed(ctx context.Context, op string, c *callConfig, rec Record, err error) {
	if l.observer == nil {
		return
	}
	e := l.opEvent(StoreFailed, c, time.Time{})
	e.Op, e.Err, e.Fence, e.Attempt, e.AttemptID = op, err, rec.Fence, rec.Attempt, rec.AttemptID
	l.observer.Observe(ctx, e)
}

// observeLeaseExtended reports a heartbeat's extension, if an Observer is
// attached.
func (l *Ledger) observeLeaseExtended(ctx context.Context, c *callConfig, rec Record, deadline time.Time) {
	if l.observer == nil {
		return
	}
	e := l.opEvent(LeaseExtended, c, time.Time{})
	e.Fence, e.Attempt, e.AttemptID, e.Deadline = rec.Fence, rec.Attempt, rec.AttemptID, deadline
	l.observer.Observe(ctx, e)
}

// observeLeaseLost reports that the running attempt lost its key (why:
// "refused", "ran-out" or "taken-over"), if an Observer is attached.
func (l *Ledger) observeLeaseLost(ctx context.Context, c *callConfig, rec Record, why string, err error) {
	if l.observer == nil {
		return
	}
	e := l.opEvent(LeaseLost, c, time.Time{})
	e.Reason, e.Err, e.Fence, e.Attempt, e.AttemptID = why, err, rec.Fence, rec.Attempt, rec.AttemptID
	l.observer.Observe(ctx, e)
}
