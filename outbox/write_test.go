package outbox_test

import (
	"errors"
	"testing"
	"time"

	"github.com/idemkit/idem"
	"github.com/idemkit/idem/outbox"
	"github.com/idemkit/idem/queue"
)

// TestPublishTx: PublishTx sets the dedup id and the Idem-Key attribute to
// the operation key; writing the same operation again (a retried request
// in a new transaction) is a duplicate in the outbox; an invalid key, or a
// message whose dedup id is another, writes nothing.
func TestPublishTx(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	ctx := t.Context()
	key := idem.Key("order-placed", "8891")
	write := func(k idem.OperationKey, m queue.Outgoing) (queue.Published, error) {
		tx, err := a.store.DB().BeginTx(ctx, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer tx.Rollback()
		p, err := outbox.PublishTx(ctx, a.outbox, tx, k, m)
		if err == nil {
			err = tx.Commit()
		}
		return p, err
	}
	first, err := write(key, queue.Outgoing{Body: []byte("x"), Attributes: map[string]string{"a": "b"}})
	if err != nil || first.Duplicate {
		t.Fatalf("first write: %+v, %v", first, err)
	}
	again, err := write(key, queue.Outgoing{Body: []byte("x")})
	if err != nil || !again.Duplicate || again.ID != first.ID {
		t.Fatalf("second write of the key: %+v, %v; want a duplicate of %s", again, err, first.ID)
	}
	if _, err := write(idem.Key("order-placed", ""), queue.Outgoing{}); !errors.Is(err, idem.ErrInvalidKey) {
		t.Fatalf("invalid key: %v, want ErrInvalidKey", err)
	}
	if _, err := write(idem.Key("other"), queue.Outgoing{DedupID: "something-else"}); err == nil {
		t.Fatal("a DedupID other than the key was accepted")
	}
	if st := stats(t, a.outbox); st.Ready != 1 {
		t.Fatalf("outbox: %+v, want one message", st)
	}

	ds, err := a.outbox.Receive(ctx, 10)
	if err != nil || len(ds) != 1 {
		t.Fatalf("receive: %d, %v", len(ds), err)
	}
	m := ds[0].Message()
	if m.DedupID != key.String() || m.Attributes[outbox.KeyAttribute] != key.String() || m.Attributes["a"] != "b" {
		t.Fatalf("outbox message %+v: want the key as dedup id and %s, and the caller's attributes", m, outbox.KeyAttribute)
	}
	if got, err := outbox.MessageKey(m); err != nil || got != key {
		t.Fatalf("MessageKey = %v, %v; want %v", got, err, key)
	}
	if _, err := outbox.MessageKey(queue.Message{}); !errors.Is(err, outbox.ErrNoKey) {
		t.Fatalf("MessageKey of a message without the attribute: %v, want ErrNoKey", err)
	}
}

// TestDedupID: the relay's dedup id is the message's own, or the prefix,
// the outbox id and the publish time.
func TestDedupID(t *testing.T) {
	a := openApp(t, "", 30*time.Second)
	r, err := outbox.NewRelay(a.outbox, &recorder{}, outbox.WithDedupPrefix("billing:"))
	if err != nil {
		t.Fatal(err)
	}
	at := time.UnixMicro(1733017681123456)
	for _, tc := range []struct {
		m    queue.Message
		want string
	}{
		{queue.Message{ID: "42", DedupID: "order-placed:1", Published: at}, "order-placed:1"},
		{queue.Message{ID: "42", Published: at}, "billing:42:1733017681123456"},
		{queue.Message{ID: "42"}, "billing:42"},
		{queue.Message{}, ""},
	} {
		if got := r.DedupID(tc.m); got != tc.want {
			t.Errorf("DedupID(%+v) = %q, want %q", tc.m, got, tc.want)
		}
	}
}
