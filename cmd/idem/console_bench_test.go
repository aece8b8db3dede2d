package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/idemkit/idem/store"
	"github.com/idemkit/idem/store/pgstore"
	"github.com/idemkit/idem/store/sqlitestore"
)

// BenchmarkConsole times the console's pages over the 100,000 records
// BenchmarkServeList writes (seedListBench), on SQLite and PostgreSQL: the
// records list's first page (50 rows) unfiltered and filtered, and the
// overview, which reads the first 10,000 records to count them. The target
// (issue 23) is the list's first page under 100 ms.
//
//	go test -run '^$' -bench BenchmarkConsole -benchtime 20x ./cmd/idem/
func BenchmarkConsole(b *testing.B) {
	b.Run("sqlite", func(b *testing.B) {
		s, err := sqlitestore.Open(context.Background(), filepath.Join(b.TempDir(), "idem.db"))
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		benchConsole(b, s, func() {})
	})
	b.Run("postgres", func(b *testing.B) {
		u := os.Getenv(envPostgres)
		if u == "" {
			b.Skip("set " + envPostgres + " to run on PostgreSQL")
		}
		ctx := context.Background()
		conn, err := pgx.Connect(ctx, u)
		if err != nil {
			b.Fatal(err)
		}
		var r [6]byte
		rand.Read(r[:])
		schema := "idemconsolebench_" + hex.EncodeToString(r[:])
		if _, err := conn.Exec(ctx, "CREATE SCHEMA "+schema); err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() {
			_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE")
			conn.Close(context.Background())
		})
		pu, _ := url.Parse(u)
		q := pu.Query()
		q.Set(pgstore.ParamSchema, schema)
		pu.RawQuery = q.Encode()
		s, err := pgstore.Open(ctx, pu.String())
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		benchConsole(b, s, func() {
			if _, err := conn.Exec(ctx, "ANALYZE "+schema+".idem_records"); err != nil {
				b.Fatal(err)
			}
		})
	})
}

func benchConsole(b *testing.B, s store.Store, analyze func()) {
	seedListBench(b, s)
	analyze()
	c, _ := newConsoleTest(b, s, "", "", false)
	c.c = &http.Client{}
	for _, p := range []struct{ name, path string }{
		{"records", "/console/records"},
		{"records_failed", "/console/records?state=failed"},
		{"records_stuck", "/console/records?state=stuck"},
		{"records_prefix", "/console/records?prefix=k-0500"},
		{"overview", "/console/"},
	} {
		b.Run(p.name, func(b *testing.B) {
			n := 0
			for b.Loop() {
				resp, err := http.Get(c.base + p.path)
				if err != nil {
					b.Fatal(err)
				}
				body, err := io.ReadAll(resp.Body)
				resp.Body.Close()
				if err != nil || resp.StatusCode != 200 || !strings.Contains(string(body), "</html>") {
					b.Fatalf("%d %v %s", resp.StatusCode, err, body)
				}
				n = len(body)
			}
			b.ReportMetric(float64(n), "bytes/page")
		})
	}
}
