package idem_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/store/memstore"
)

// receipt has a field JSON leaves out: the first call and its duplicates
// must still answer the same value.
type receipt struct {
	ID    string
	Cache string `json:"-"`
}

func TestRunAnswersTheStoredValueToTheFirstCallToo(t *testing.T) {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("receipt", 1)
	send := func(context.Context) (receipt, error) { return receipt{ID: "ses-1", Cache: "live"}, nil }

	first, res, err := idem.Run(ctx, l, key, send)
	if err != nil || res.Replayed {
		t.Fatalf("first call: %+v %+v %v", first, res, err)
	}
	dup, res, err := idem.Run(ctx, l, key, send)
	if err != nil || !res.Replayed {
		t.Fatalf("duplicate: %+v %+v %v", dup, res, err)
	}
	if first != dup {
		t.Fatalf("the first call answered %+v, its duplicate %+v: callers of one key see different values", first, dup)
	}
	if first != (receipt{ID: "ses-1"}) {
		t.Fatalf("answer %+v, want the stored value {ID: ses-1}", first)
	}
}

// stringer marshals to an object that cannot be decoded back into the
// interface-typed field that holds it.
type stringer struct{ S string }

func (s stringer) String() string { return s.S }

type undecodable struct{ Who fmt.Stringer }

func TestRunRefusesAResultDuplicatesCouldNotDecode(t *testing.T) {
	ctx := context.Background()
	l := idem.New(memstore.New(), idem.WithLogger(slog.New(slog.DiscardHandler)))
	key := idem.Key("greeting", 1)
	runs := 0
	fn := func(context.Context) (undecodable, error) {
		runs++
		return undecodable{Who: stringer{"ann"}}, nil
	}

	_, _, err := idem.Run(ctx, l, key, fn)
	if err == nil || !strings.Contains(err.Error(), "does not decode back") {
		t.Fatalf("Run = %v, want an error saying the result does not decode back", err)
	}
	// Not recorded as completed: a duplicate must not get a decoding error
	// for ever. The attempt is left to the policy, like a crash.
	rec, err := l.Store().Get(ctx, key.String())
	if err != nil {
		t.Fatal(err)
	}
	if rec.Status == idem.StatusCompleted {
		t.Fatalf("the key was recorded completed with a result no duplicate can decode: %+v", rec)
	}
	// Under AtLeastOnce the next delivery takes the abandoned attempt over
	// (and fails the same way); it never reads a stored result it cannot
	// decode.
	_, _, err = idem.Run(ctx, l, key, fn)
	if err == nil || !strings.Contains(err.Error(), "does not decode back") {
		t.Fatalf("duplicate = %v: want a takeover failing to record, not a stored result it cannot decode", err)
	}
	if runs != 2 {
		t.Fatalf("fn ran %d times, want 2 (the first attempt, then the takeover)", runs)
	}
}
