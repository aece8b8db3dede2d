package sqlqueue_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/idemkit/idem/queue"
	"github.com/idemkit/idem/queue/sqlqueue"
	"github.com/jackc/pgx/v5"
)

// deadLetterer is what badText needs of a queue of either backend.
type deadLetterer interface {
	queue.Publisher
	queue.Source
	DeadLetters(ctx context.Context, max int) ([]sqlqueue.DeadLetter, error)
}

// badText: strings that PostgreSQL cannot store (not UTF-8, NUL) are
// refused in a message's group id, dedup id and attributes, with
// ErrBadMessage and nothing published, alike on both backends; in a
// dead-letter reason (often an error's text quoting the message) they are
// stored as U+FFFD, so the message is dead-lettered, not stuck.
func badText(t *testing.T, q deadLetterer) {
	ctx := context.Background()
	for name, m := range map[string]queue.Outgoing{
		"attribute value with NUL":    {Body: []byte("x"), Attributes: map[string]string{"k": "a\x00b"}},
		"attribute value not UTF-8":   {Body: []byte("x"), Attributes: map[string]string{"k": "a\xffb"}},
		"attribute name not UTF-8":    {Body: []byte("x"), Attributes: map[string]string{"k\xff": "v"}},
		"group id not UTF-8":          {Body: []byte("x"), GroupID: "g\xff"},
		"group id with NUL":           {Body: []byte("x"), GroupID: "g\x00"},
		"dedup id not UTF-8":          {Body: []byte("x"), DedupID: "d\xff"},
		"dedup id with NUL":           {Body: []byte("x"), DedupID: "d\x00"},
		"body any bytes (accepted)":   {Body: []byte("ok \xff\x00")},
		"attributes UTF-8 (accepted)": {Body: []byte("ok"), Attributes: map[string]string{"é": "日本"}},
	} {
		_, err := q.Publish(ctx, m)
		if accepted := strings.HasPrefix(string(m.Body), "ok"); accepted != (err == nil) || (!accepted && !errors.Is(err, sqlqueue.ErrBadMessage)) {
			t.Errorf("%s: Publish = %v", name, err)
		}
	}
	for range 2 {
		ds := receive(t, q, 10)
		for _, d := range ds {
			if err := d.DeadLetter(ctx, "undecodable: \"poison\xff\" \x00"); err != nil {
				t.Fatalf("DeadLetter with a reason that is not UTF-8: %v", err)
			}
		}
		if len(ds) == 2 {
			break
		}
	}
	receiveNone(t, q)
	dls, err := q.DeadLetters(ctx, 10)
	if err != nil || len(dls) != 2 {
		t.Fatalf("dead letters %+v, %v; want the two accepted messages", dls, err)
	}
	for _, dl := range dls {
		if dl.Reason != "undecodable: \"poison\uFFFD\" \uFFFD" {
			t.Fatalf("reason %q, want the bytes replaced with U+FFFD", dl.Reason)
		}
	}
	// A reason quoting a whole response keeps its first 4,096 bytes.
	publish(t, q, queue.Outgoing{Body: []byte("long")})
	why := strings.Repeat("é", 10000)
	if err := receive(t, q, 1)[0].DeadLetter(ctx, why); err != nil {
		t.Fatal(err)
	}
	if dls, err = q.DeadLetters(ctx, 10); err != nil || len(dls) != 3 || dls[2].Reason != why[:4096] {
		t.Fatalf("dead letters %d (%v); want the long reason's first 4,096 bytes last", len(dls), err)
	}
}

func TestSQLiteBadText(t *testing.T) {
	e := openSQLite(t, "", nil)
	badText(t, e.queue(t, "q"))
	if _, err := e.qs.Queue("q\xff"); !errors.Is(err, sqlqueue.ErrBadName) {
		t.Fatalf("a queue name that is not UTF-8: %v", err)
	}
}

func TestPostgresBadText(t *testing.T) {
	pool := pgPool(t)
	p := openPostgres(t, pool, pgSchema(t, pool))
	badText(t, pgQueue(t, p, "q"))
	if _, err := p.Queue("q\x00"); !errors.Is(err, sqlqueue.ErrBadName) {
		t.Fatalf("a queue name with a NUL: %v", err)
	}
}

// A PublishTx measures its delay and its dedup window from the publish,
// not from the start of the caller's transaction (which may have been
// open for long), as on SQLite.
func TestPostgresPublishTxClock(t *testing.T) {
	pool := pgPool(t)
	schema := pgSchema(t, pool)
	q := pgQueue(t, openPostgres(t, pool, schema), "q", sqlqueue.WithDedupWindow(500*time.Millisecond))
	ctx := context.Background()
	first := publish(t, q, queue.Outgoing{Body: []byte("first"), DedupID: "d"})
	var (
		began       time.Time
		late, again queue.Published
	)
	err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		// The caller's other work, after its transaction began.
		if err := tx.QueryRow(ctx, "SELECT now(), pg_sleep(0.8)").Scan(&began, new(any)); err != nil {
			return err
		}
		var err error
		if late, err = q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("later"), Delay: time.Hour}); err != nil {
			return err
		}
		again, err = q.PublishTx(ctx, tx, queue.Outgoing{Body: []byte("again"), DedupID: "d"})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	if again.Duplicate || again.ID == first.ID {
		t.Fatalf("a dedup id whose window passed during the transaction was a duplicate: %+v", again)
	}
	var published, visible time.Time
	if err := pool.QueryRow(ctx, `SELECT published, visible_at FROM `+pgx.Identifier{schema, "idem_queue_messages"}.Sanitize()+
		` WHERE id = $1`, late.ID).Scan(&published, &visible); err != nil {
		t.Fatal(err)
	}
	if published.Sub(began) < 700*time.Millisecond || visible.Sub(published) != time.Hour {
		t.Fatalf("published %v, visible %v after a transaction begun at %v; want both from the publish, 0.8 s in",
			published, visible, began)
	}
}
