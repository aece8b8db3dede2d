package pgstore

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/idemkit/idem/store"
	"github.com/jackc/pgx/v5"
)

func claimNew(t *testing.T, s store.Store, key string) store.ClaimResult {
	t.Helper()
	cr, err := s.Claim(context.Background(), store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: key, Owner: "o", Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour})
	if err != nil {
		t.Fatalf("Claim(%q): %v", key, err)
	}
	return cr
}

// TestMigrateConcurrentOpeners: processes opening a new store at the same
// time all succeed, and the migrations run once.
func TestMigrateConcurrentOpeners(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	loc := withParams(t, testURL(t), ParamSchema, schema)
	var wg sync.WaitGroup
	errs := make(chan error, 8)
	for range 8 {
		wg.Go(func() {
			s, err := Open(context.Background(), loc)
			if err != nil {
				errs <- err
				return
			}
			s.Close()
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Errorf("concurrent Open: %v", err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	var n, maxV int
	err = testPool(t).QueryRow(context.Background(), "SELECT count(*), max(version) FROM "+
		pgx.Identifier{schema, DefaultTable + "_migrations"}.Sanitize()).Scan(&n, &maxV)
	if err != nil || n != len(ms) || maxV != len(ms) {
		t.Fatalf("migrations table: %d rows, version %d, %v; want %d", n, maxV, err, len(ms))
	}
}

// TestMigrateOff: without migrations the store does not touch the
// database until used, and a missing table is an error that names it.
func TestMigrateOff(t *testing.T) {
	t.Parallel()
	schema := newSchema(t)
	ctx := context.Background()
	s, err := Open(ctx, testURL(t), WithSchema(schema), WithMigrate(false))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	_, err = s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: "k", Policy: store.AtLeastOnce, Lease: time.Minute})
	if !errors.Is(err, ErrNoTable) || !strings.Contains(err.Error(), schema) {
		t.Fatalf("Claim on a missing table: %v, want an error naming the table", err)
	}
	if _, err := s.Get(ctx, "k"); err == nil || errors.Is(err, store.ErrNotFound) {
		t.Fatalf("Get on a missing table: %v, want an error that is not ErrNotFound", err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatal(err)
	}
	if err := s.Migrate(ctx); err != nil {
		t.Fatalf("second Migrate: %v", err)
	}
	if cr := claimNew(t, s, "k"); !cr.Acquired {
		t.Fatal("claim after Migrate: not acquired")
	}
}

// TestURLParams: the schema, table and migration switch can be named in
// the URL (for the idem command's --store) and in keyword/value form; the
// options of Open take precedence.
func TestURLParams(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	u := testURL(t)

	a, err := Open(ctx, withParams(t, u, ParamSchema, schema, ParamTable, "billing"))
	if err != nil {
		t.Fatal(err)
	}
	defer a.Close()
	if want := (pgx.Identifier{schema, "billing"}).Sanitize(); a.Table() != want {
		t.Fatalf("Table() = %s, want %s", a.Table(), want)
	}
	b, err := Open(ctx, withParams(t, u, ParamSchema, schema, ParamTable, "billing"), WithTable("emails"))
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if !strings.HasSuffix(b.Table(), `"emails"`) {
		t.Fatalf("WithTable did not take precedence over the URL: %s", b.Table())
	}
	// Two tables in one schema are two stores.
	if !claimNew(t, a, "k").Acquired || !claimNew(t, b, "k").Acquired {
		t.Fatal("the same key in two tables: not acquired in both")
	}

	// Keyword/value form.
	p, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	pw, _ := p.User.Password()
	dsn := fmt.Sprintf("host=%s port=%s user=%s password='%s' dbname=%s sslmode=disable %s=%s %s=kv",
		p.Hostname(), p.Port(), p.User.Username(), pw, strings.TrimPrefix(p.Path, "/"), ParamSchema, schema, ParamTable)
	c, err := Open(ctx, dsn)
	if err != nil {
		t.Fatalf("Open(keyword/value): %v", err)
	}
	defer c.Close()
	if !strings.HasSuffix(c.Table(), `"kv"`) || !claimNew(t, c, "k").Acquired {
		t.Fatalf("keyword/value store on %s", c.Table())
	}

	// idem_migrate=false: nothing is created.
	d, err := Open(ctx, withParams(t, u, ParamSchema, schema, ParamTable, "never", ParamMigrate, "false"))
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if _, err := d.Get(ctx, "k"); !errors.Is(err, ErrNoTable) {
		t.Fatalf("Get with idem_migrate=false: %v, want the missing table", err)
	}
	if _, err := Open(ctx, withParams(t, u, ParamMigrate, "maybe")); err == nil {
		t.Fatal("Open with idem_migrate=maybe: no error")
	}
	if _, err := Open(ctx, "postgres://%zz"); err == nil {
		t.Fatal("Open of a bad URL: no error")
	}
}

// TestSearchPath: without WithSchema the table is made and used in the
// first schema of the connection's search_path.
func TestSearchPath(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	if _, err := testPool(t).Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize()); err != nil {
		t.Fatal(err)
	}
	s, err := Open(ctx, withParams(t, testURL(t), "search_path", schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if s.Table() != `"`+DefaultTable+`"` {
		t.Fatalf("Table() = %s", s.Table())
	}
	claimNew(t, s, "k")
	var n int
	if err := testPool(t).QueryRow(ctx, "SELECT count(*) FROM "+pgx.Identifier{schema, DefaultTable}.Sanitize()).Scan(&n); err != nil || n != 1 {
		t.Fatalf("the record is not in %s.%s: %d, %v", schema, DefaultTable, n, err)
	}
}

// TestMigrateUpgrade: a table at an older version gets the newer
// migrations when a store opens it.
func TestMigrateUpgrade(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	schema := newSchema(t)
	s, err := Open(ctx, testURL(t), WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	// Implicit journals of each kind: completed, released with a reason,
	// in progress.
	claimed := map[string]store.ClaimResult{}
	for _, k := range []string{"k", "r", "p"} {
		if claimed[k], err = s.Claim(ctx, store.ClaimRequest{AttemptID: store.NewAttemptID(), Key: k, Owner: "o", Correlation: "msg-" + k, Policy: store.AtLeastOnce, Lease: time.Minute, Retention: time.Hour}); err != nil {
			t.Fatal(err)
		}
	}
	end := func(key string, o store.Outcome, result []byte, reason string) store.FinishRequest {
		cr := claimed[key]
		return store.FinishRequest{Key: key, Fence: cr.Record.Fence, AttemptID: cr.Record.AttemptID, Outcome: o, Result: result, Reason: reason, Retention: time.Hour}
	}
	if err := s.Finish(ctx, end("k", store.OutcomeCompleted, []byte("ok"), "")); err != nil {
		t.Fatal(err)
	}
	if err := s.Finish(ctx, end("r", store.OutcomeReleased, nil, "try later")); err != nil {
		t.Fatal(err)
	}
	// What a build from before version 4 reads back: no attempt ids.
	before := map[string]store.Record{}
	for _, k := range []string{"k", "r", "p"} {
		if before[k], err = s.Get(ctx, k); err != nil {
			t.Fatal(err)
		}
		before[k].Journal[0].AttemptID = ""
		rec := before[k]
		rec.AttemptID = ""
		before[k] = rec
	}
	versions := pgx.Identifier{schema, DefaultTable + "_migrations"}.Sanitize()
	// Back to version 1: the journal written out (as implicitJournalSQL
	// writes it) without attempt ids, no correlation or attempt_id column.
	for _, q := range []string{
		"UPDATE " + s.Table() + " AS t SET journal = " + wireNames.Replace(implicitJournalSQL("t")),
		"UPDATE " + s.Table() + " AS t SET journal = (SELECT jsonb_agg(j.e - '" + store.WireAttemptID + "' ORDER BY j.o) FROM jsonb_array_elements(t.journal) WITH ORDINALITY AS j(e, o))",
		"ALTER TABLE " + s.Table() + " DROP COLUMN correlation, DROP COLUMN attempt_id, ALTER COLUMN journal SET NOT NULL, RESET (vacuum_truncate)",
		"DELETE FROM " + versions + " WHERE version >= 2",
	} {
		if _, err := s.Pool().Exec(ctx, q); err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	s2, err := Open(ctx, testURL(t), WithSchema(schema))
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	var opts []string
	var v int
	if err := s.Pool().QueryRow(ctx, "SELECT reloptions, (SELECT max(version) FROM "+versions+") FROM pg_class WHERE oid = $1::regclass", s.Table()).Scan(&opts, &v); err != nil {
		t.Fatal(err)
	}
	ms, err := migrations()
	if err != nil {
		t.Fatal(err)
	}
	if v != len(ms) || !strings.Contains(strings.Join(opts, ","), "vacuum_truncate=false") {
		t.Fatalf("after reopening: version %d, reloptions %v; want version %d", v, opts, len(ms))
	}
	// The journals written out in SQL read back as the implicit ones did.
	for k, want := range before {
		if rec, err := s2.Get(ctx, k); err != nil || !reflect.DeepEqual(rec, want) {
			t.Fatalf("%s after the upgrade:\n got %+v, %v\nwant %+v", k, rec, err, want)
		}
	}
	// A row from before version 4 has no attempt id: no attempt can end
	// it (nor is one marked as finishing late); it is resolved (or lapses
	// and is taken over) as usual.
	if err := s2.Finish(ctx, end("p", store.OutcomeCompleted, []byte("ok"), "")); !errors.Is(err, store.ErrLeaseLost) {
		t.Fatalf("Finish of a row from before version 4: %v, want ErrLeaseLost", err)
	}
	if rec, err := s2.Get(ctx, "p"); err != nil || !reflect.DeepEqual(rec, before["p"]) {
		t.Fatalf("p after a refused finish:\n got %+v, %v\nwant %+v", rec, err, before["p"])
	}
	if rec, err := s2.Resolve(ctx, store.ResolveRequest{Key: "p", Fence: claimed["p"].Record.Fence, InProgress: true, Done: true, Result: []byte("ok")}); err != nil ||
		rec.Status != store.StatusCompleted || rec.Fence != claimed["p"].Record.Fence+1 {
		t.Fatalf("Resolve of a row from before version 4: %+v, %v", rec, err)
	}
}
