package main

import (
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/idemkit/idem/store"
)

// BenchmarkConsole times the console's pages over the 100,000 records
// BenchmarkServeList writes (seedListBench), on SQLite and PostgreSQL: the
// records list's first page (50 rows) unfiltered and filtered, and the
// overview, which reads the first 10,000 records to count them. The target
// (issue 23) is the list's first page under 100 ms.
//
//	go test -run '^$' -bench BenchmarkConsole -benchtime 20x ./cmd/idem/
func BenchmarkConsole(b *testing.B) { benchOnStores(b, "idemconsolebench_", benchConsole) }

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
