package demo

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// A delivery whose ack the broker refused is not settled: the message comes
// back. Counting it would let the run end with a message still queued.
func TestTallyDoesNotCountARefusedSettlement(t *testing.T) {
	tl := newTally()
	log := slog.New(tl).With(slog.String("key", "receipt:1:2"))
	log.Error("queue message replayed", "outcome", "replayed", "action", "ack", "settle_error", "sqlqueue: stale receipt")
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tl.waitSettled(ctx, func() int { return 1 }, time.Minute); err == nil {
		t.Fatal("waitSettled counted a message whose ack failed as settled")
	}
	log.Info("queue message replayed", "outcome", "replayed", "action", "ack")
	if err := tl.waitSettled(context.Background(), func() int { return 1 }, time.Minute); err != nil {
		t.Fatal(err)
	}
}

// Attributes under a group are not the delivery's: a handler derived with
// WithGroup must not read "g.outcome" as the outcome.
func TestTallyKeepsGroupsApart(t *testing.T) {
	tl := newTally()
	slog.New(tl).WithGroup("g").Info("queue message executed", "outcome", "executed", "action", "ack")
	slog.New(tl).WithGroup("g").With("key", "k").Info("x")
	slog.New(tl).With("key", "receipt:1:2").WithGroup("g").Info("queue message executed", "outcome", "executed", "action", "ack")
	var sum Summary
	tl.summarize(&sum)
	if len(sum.Lines) != 0 {
		t.Fatalf("grouped attributes read as a delivery's line: %+v", sum.Lines)
	}
	slog.New(tl).WithGroup("g").Info("queue message executed", slog.Group("", slog.String("outcome", "executed")))
	tl.summarize(&sum)
	if len(sum.Lines) != 0 {
		t.Fatalf("grouped attributes read as a delivery's line: %+v", sum.Lines)
	}
	slog.New(tl).With("key", "receipt:1:2").WithGroup("g").Info("queue message executed", "x", 1)
	log := slog.New(tl).With("outcome", "executed", "action", "ack").WithGroup("g").With("key", "other")
	log.Info("queue message executed", "key", "other2")
	tl.summarize(&sum)
	if len(sum.Lines) != 1 || sum.Lines[0].Key != "" || sum.Lines[0].Outcome != "executed" {
		t.Fatalf("lines %+v, want one executed line without a key", sum.Lines)
	}
	if want := `level=INFO msg="queue message executed" outcome=executed action=ack g.key=other g.key=other2`; sum.Lines[0].Text != want {
		t.Errorf("text %q, want %q", sum.Lines[0].Text, want)
	}
}

// A run where no delivery is handled any more gives up after its stall
// time, even though its context has no deadline.
func TestWaitSettledGivesUpWhenNothingHappens(t *testing.T) {
	tl := newTally()
	start := time.Now()
	err := tl.waitSettled(context.Background(), func() int { return 1 }, 50*time.Millisecond)
	if !errors.Is(err, errStalled) {
		t.Fatalf("waitSettled = %v, want errStalled", err)
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("took %v", took)
	}
}
