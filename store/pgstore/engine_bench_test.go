package pgstore

import (
	"cmp"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/jackc/pgx/v5"
)

// BenchmarkEngineStatements runs the store's own statements from pgbench,
// with no Go client in the way, beside the bare inserts that issue 3
// measures the store against, at the same clients and durability:
//
//	insert          INSERT INTO k VALUES (md5(random()::text)) ON CONFLICT DO NOTHING
//	claim           the store's claim of a new key alone: one statement,
//	                one commit (BenchmarkClaim runs it from Go; the target
//	                is Go ≥ 0.9× this)
//	claim-planned   the same, parsed and planned for each call (pgbench
//	                -M extended): what a claim costs while the store's
//	                table is young (see plans.go)
//	claim+complete  the store's claim of a new key, then its completion:
//	                two statements, two commits (the unbatched target is
//	                0.45× insert)
//	row+update      the floor of any claim+complete on the store's table:
//	                a bare INSERT of a new record's row and a bare UPDATE
//	                of its status, result and times (no journal, no check)
//	insert-10       the bare insert of 10 rows in one statement
//	row-10          the floor of any batch claim of 10 on the store's table:
//	                a bare insert of 10 new records' rows (their journal
//	                implicit, as a claim writes them) in one statement
//	claim-batch-10  the store's full batch claim statement of 10 new keys
//	claim-new-10    the statement ClaimBatch starts with while keys are
//	                mostly new (claimNewSQL), 10 new keys
//
// Each reports pgbench's transactions a second (ops/s) and keys/s. The
// store's table is prefilled (see prefill), so that the statements run on
// a table in use. Every case but claim-planned runs prepared statements
// (pgbench -M prepared), as the store runs its own on such a table. The ratio
// claim+complete ÷ insert is the most any Go client of these statements
// can reach:
//
//	IDEM_TEST_POSTGRES=... go test -run '^$' -bench EngineStatements -benchtime 40000x ./store/pgstore/
func BenchmarkEngineStatements(b *testing.B) {
	path, err := exec.LookPath("pgbench")
	if err != nil {
		b.Skip("pgbench is not installed")
	}
	s := benchStore(b, 1)
	ctx := context.Background()
	bare := pgx.Identifier{s.names.schema, "bench_k"}.Sanitize()
	if _, err := s.pool.Exec(ctx, "CREATE TABLE "+bare+" (k text PRIMARY KEY)"); err != nil {
		b.Fatal(err)
	}
	prefill(b, s)
	// The statements' parameters, as pgbench expressions: :n is a random
	// number per transaction, so a claim and its completion share a key
	// and an attempt id. The completion reads the fence the claim made
	// (the clock's) from the row, a lookup by key in the statement.
	key, id := "('e' || :n)", "('a' || :n)"
	claim := pgbenchParams(s.q.claim, key, "'bench'", "'bench'", "'at_least_once'", "30000000", "3600000000", "''", "false", id)
	claimOnly := func(key string) string {
		return pgbenchParams(s.q.claim, key, "'bench'", "'bench'", "'at_least_once'", "30000000", "3600000000", "''", "false", id)
	}
	complete := pgbenchParams(s.q.complete, key, "(SELECT f.fence FROM "+s.Table()+" AS f WHERE f.key = "+key+")", id, "'ok'", "3600000000")
	arr := func(v, typ string) string { return "array_fill(" + v + "::" + typ + ", ARRAY[10])" }
	claimBatch := pgbenchParams(s.q.claimBatch,
		"(SELECT array_agg('e' || :n || '-' || g) FROM generate_series(1, 10) AS g)",
		arr("'bench'", "text"), arr("'bench'", "text"), arr("'at_least_once'", "text"),
		arr("30000000", "bigint"), arr("3600000000", "bigint"), arr("''", "text"), arr("false", "boolean"),
		"(SELECT array_agg('a' || :n || '-' || g) FROM generate_series(1, 10) AS g)")
	claimNew := pgbenchParams(s.q.claimNew,
		"(SELECT array_agg('n' || :n || '-' || g) FROM generate_series(1, 10) AS g)",
		arr("'bench'", "text"), arr("'bench'", "text"), arr("'at_least_once'", "text"),
		arr("30000000", "bigint"), arr("3600000000", "bigint"), arr("''", "text"),
		"(SELECT array_agg('a' || :n || '-' || g) FROM generate_series(1, 10) AS g)")
	const rnd = "\\set n random(1, 1000000000000)\n"
	ranClaims := false
	for _, x := range []struct {
		name, script string
		keys         int
		mode         string // pgbench -M; prepared when empty
	}{
		{"insert", "INSERT INTO " + bare + " VALUES (md5(random()::text)) ON CONFLICT DO NOTHING;\n", 1, ""},
		{"claim", rnd + claimOnly("('c' || :n)") + ";\n", 1, ""},
		{"claim-planned", rnd + claimOnly("('p' || :n)") + ";\n", 1, "extended"},
		{"claim+complete", rnd + claim + ";\n" + complete + ";\n", 1, ""},
		{"row+update", rnd + "INSERT INTO " + s.Table() + " (key, status, policy, fence, attempt, owner, lease_until, expires_at, created_at, updated_at) " +
			"VALUES ('f' || :n, 'in_progress', 'at_least_once', 1, 1, 'bench', now() + interval '30 s', now() + interval '1 hour', now(), now()) ON CONFLICT DO NOTHING;\n" +
			"UPDATE " + s.Table() + " SET status = 'completed', result = 'ok', lease_until = now(), updated_at = now(), expires_at = now() + interval '1 hour' " +
			"WHERE key = 'f' || :n AND fence = 1 AND status = 'in_progress';\n", 1, ""},
		{"insert-10", "INSERT INTO " + bare + " SELECT md5(random()::text) FROM generate_series(1, 10) ON CONFLICT DO NOTHING;\n", 10, ""},
		{"row-10", rnd + "INSERT INTO " + s.Table() + " (key, status, policy, fence, attempt, owner, lease_until, expires_at, created_at, updated_at, journal, correlation) " +
			"SELECT 'r' || :n || '-' || g, 'in_progress', 'at_least_once', 1, 1, 'bench', now() + interval '30 s', now() + interval '1 hour', now(), now(), NULL, 'bench' " +
			"FROM generate_series(1, 10) AS g ON CONFLICT DO NOTHING;\n", 10, ""},
		{"claim-batch-10", rnd + claimBatch + ";\n", 10, ""},
		{"claim-new-10", rnd + claimNew + ";\n", 10, ""},
	} {
		file := filepath.Join(b.TempDir(), "script.sql")
		if err := os.WriteFile(file, []byte(x.script), 0o644); err != nil {
			b.Fatal(err)
		}
		for _, n := range callers {
			b.Run(fmt.Sprintf("%s/callers=%d", x.name, n), func(b *testing.B) {
				tps := pgbench(b, path, file, cmp.Or(x.mode, "prepared"), n)
				ranClaims = ranClaims || x.name == "claim+complete"
				b.ReportMetric(tps, "ops/s")
				b.ReportMetric(tps*float64(x.keys), "keys/s")
				b.ReportMetric(1e9/tps, "ns/op")
			})
		}
	}
	// The claims pgbench made of single keys were all completed: the
	// statements ran as the store runs them, not as no-ops.
	if !ranClaims {
		return
	}
	var open, done int
	err = s.pool.QueryRow(ctx, "SELECT count(*) FILTER (WHERE status <> 'completed'), count(*) FILTER (WHERE status = 'completed') FROM "+
		s.Table()+" WHERE key LIKE 'e%' AND key NOT LIKE '%-%'").Scan(&open, &done)
	if err != nil || open != 0 || done == 0 {
		b.Fatalf("claim+complete left %d keys not completed, %d completed (%v)", open, done, err)
	}
}

// pgbenchParams makes a statement of the store's pgbench can run: each
// $i replaced by the expression args[i-1], in parentheses, on one line.
func pgbenchParams(sql string, args ...string) string {
	sql = regexp.MustCompile(`\$([0-9]+)`).ReplaceAllStringFunc(sql, func(m string) string {
		i, _ := strconv.Atoi(m[1:])
		return "(" + args[i-1] + ")"
	})
	return regexp.MustCompile(`\s+`).ReplaceAllString(sql, " ")
}

// pgbench runs script with clients connections (in query mode mode,
// 2 threads) for b.N transactions in all (at least 50 per client), and
// returns its rate.
func pgbench(b *testing.B, path, script, mode string, clients int) float64 {
	per := max(b.N/clients, 50)
	cmd := exec.Command(path, "-n", "-M", mode, "-f", script, "-c", strconv.Itoa(clients), "-j", "2",
		"-t", strconv.Itoa(per), testURL(b))
	b.ResetTimer()
	out, err := cmd.CombinedOutput()
	b.StopTimer()
	if err != nil {
		b.Fatalf("pgbench: %v\n%s", err, out)
	}
	m := regexp.MustCompile(`tps = ([0-9.]+) \(without initial connection time\)`).FindSubmatch(out)
	if m == nil {
		b.Fatalf("pgbench said:\n%s", out)
	}
	if f := regexp.MustCompile(`number of failed transactions: ([1-9][0-9]*)`).FindSubmatch(out); f != nil {
		b.Fatalf("pgbench: %s transactions failed:\n%s", f[1], out)
	}
	tps, _ := strconv.ParseFloat(string(m[1]), 64)
	return tps
}
