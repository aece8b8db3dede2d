package queue_test

import (
	"bytes"
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/memqueue"
	"github.com/idemkit/idem/store/memstore"
)

// visibilityOf wraps a source with another visibility (0: unbounded, as
// amqpqueue and lambdasqs report).
type visibilityOf struct {
	queue.Source
	v time.Duration
}

func (s visibilityOf) Visibility() time.Duration { return s.v }

// Without WithHandlerTimeout, the handler timeout is a sixth of the
// source's visibility, within 1 s (or the visibility) and 30 s, and only a
// visibility under 6 s warns.
func TestDefaultHandlerTimeoutFollowsTheVisibility(t *testing.T) {
	for _, tc := range []struct {
		visibility, want time.Duration
		warns            bool
	}{
		{0, 30 * time.Second, false},
		{30 * time.Second, 5 * time.Second, false},
		{time.Minute, 10 * time.Second, false},
		{3 * time.Minute, 30 * time.Second, false},
		{time.Hour, 30 * time.Second, false},
		{6 * time.Second, time.Second, false},
		{3 * time.Second, time.Second, true},
		{500 * time.Millisecond, 500 * time.Millisecond, true},
	} {
		if got := queue.DefaultHandlerTimeoutFor(tc.visibility); got != tc.want {
			t.Errorf("visibility %v: default handler timeout %v, want %v", tc.visibility, got, tc.want)
		}
		var buf bytes.Buffer
		log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
		src := visibilityOf{memqueue.New(), tc.visibility}
		if _, err := queue.NewConsumer(src, idem.New(memstore.New()), queue.MessageIDKey("m"), noop, queue.WithLogger(log)); err != nil {
			t.Errorf("visibility %v, default handler timeout: %v", tc.visibility, err)
		}
		if warned := strings.Contains(buf.String(), "six times"); warned != tc.warns {
			t.Errorf("visibility %v: warned %v, want %v; log: %s", tc.visibility, warned, tc.warns, buf.String())
		}
	}
}

// The derived timeout is the one the handler runs under: with memqueue's
// default visibility (30 s), a handler's context ends about 5 s on.
func TestDefaultHandlerTimeoutIsTheHandlersDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	q := memqueue.New()
	if _, err := q.Publish(ctx, queue.Outgoing{Body: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	left := make(chan time.Duration, 1)
	c, err := queue.NewConsumer(q, idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler))), queue.MessageIDKey("m"),
		func(ctx context.Context, _ queue.Message) ([]byte, error) {
			dl, ok := ctx.Deadline()
			if !ok {
				left <- -1
			} else {
				left <- time.Until(dl)
			}
			return nil, nil
		}, queue.WithLogger(slog.New(slog.DiscardHandler)))
	if err != nil {
		t.Fatal(err)
	}
	go c.Run(ctx)
	select {
	case d := <-left:
		if d < 4*time.Second || d > 5*time.Second {
			t.Fatalf("the handler's context ends in %v, want about 5 s (a sixth of memqueue's 30 s visibility)", d)
		}
	case <-ctx.Done():
		t.Fatal("the handler never ran")
	}
}
