package pgarray

import (
	"context"
	"slices"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
	"github.com/jackc/pgx/v5"
)

// TestRoundTrip sends the arrays to a real PostgreSQL, as a prepared
// statement and as one run without a description (the stores' young-table
// mode), and reads them back element for element.
func TestRoundTrip(t *testing.T) {
	url := testenv.Require(t, testenv.Postgres, "the PostgreSQL round trip of pgarray")
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	texts := []string{"", "plain", `q"uote`, `back\slash`, `\"`, "{b,r}", " sp ", "NULL", "é日本\n\t", "a,b", `""`}
	ints := Int64s{0, 1, -1, 255, 256, 1 << 40, -(1 << 62), 9223372036854775807}
	for _, mode := range []pgx.QueryExecMode{pgx.QueryExecModeCacheStatement, pgx.QueryExecModeExec} {
		var gotT []string
		var gotI []int64
		err := conn.QueryRow(ctx, `SELECT $1::text[], $2::bigint[]`, mode, Text(texts), ints).Scan(&gotT, &gotI)
		if err != nil {
			t.Fatalf("mode %v: %v", mode, err)
		}
		if !slices.Equal(gotT, texts) {
			t.Errorf("mode %v: text[] came back %q, want %q", mode, gotT, texts)
		}
		if !slices.Equal(gotI, []int64(ints)) {
			t.Errorf("mode %v: bigint[] came back %v, want %v", mode, gotI, ints)
		}
		var n int
		if err := conn.QueryRow(ctx, `SELECT cardinality($1::text[]) + cardinality($2::bigint[])`, mode, Text(nil), Int64s{}).Scan(&n); err != nil || n != 0 {
			t.Errorf("mode %v: empty arrays: %d, %v", mode, n, err)
		}
	}
}
