package idem

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"log/slog"
)

// logOutcome writes the one line a person debugging "two emails, one
// booking" needs: key (or its hash), outcome, fence, attempt (number and
// id), owner and correlation id.
func (l *Ledger) logOutcome(ctx context.Context, level slog.Level, outcome string, c *callConfig, rec Record, extra ...slog.Attr) {
	if !l.log.Enabled(ctx, level) {
		return
	}
	attrs := make([]slog.Attr, 0, 8+len(extra))
	attrs = append(attrs, l.keyAttr(rec.Key),
		slog.String("outcome", outcome),
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
	l.log.LogAttrs(ctx, level, "idem "+outcome, attrs...)
}

func (l *Ledger) logTakeover(ctx context.Context, c *callConfig, rec Record) {
	lp := lapsedOf(rec)
	l.logOutcome(ctx, slog.LevelWarn, "takeover", c, rec,
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
		sum := sha256.Sum256([]byte(key))
		return slog.String("key_hash", hex.EncodeToString(sum[:8]))
	}
	return slog.String("key", key)
}

// storeError logs and wraps an error from the store.
func (l *Ledger) storeError(ctx context.Context, op, key string, c *callConfig, rec Record, err error) error {
	if rec.Key == "" {
		rec.Key = key
	}
	l.logOutcome(ctx, slog.LevelError, "store-error", c, rec, slog.String("op", op), slog.Any("error", err))
	return &StoreError{Op: op, Key: key, Err: err}
}
