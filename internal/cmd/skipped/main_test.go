package main

import (
	"strings"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

func TestSummarise(t *testing.T) {
	pg := testenv.SkipMessage(testenv.Postgres, "the PostgreSQL suite")
	in := strings.Join([]string{
		`{"Action":"output","Package":"github.com/idemkit/idem/store/pgstore","Test":"TestConformance","Output":"    x_test.go:1: ` + pg + `\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/store/pgstore","Test":"TestConformance","Output":"--- SKIP: TestConformance (0.00s)\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/store/pgstore","Test":"TestOther","Output":"    x_test.go:2: ` + pg + `\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/httpidem","Test":"TestStores/pgstore","Output":"    x_test.go:3: ` + pg + `\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/httpidem","Test":"TestOtherStores/pgstore","Output":"    x_test.go:3: ` + pg + `\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/httpidem","Test":"TestStores/redisstore","Output":"    x_test.go:4: set IDEM_TEST_REDIS=redis://x to run it\n"}`,
		`{"Action":"output","Package":"github.com/idemkit/idem/httpidem","Test":"TestStores/redisstore","Output":"    x_test.go:4: set IDEM_TEST_REDIS=redis://x to run it\n"}`,
		`{"Action":"fail","Package":"github.com/idemkit/idem/queue"}`,
		`{"Action":"fail","Package":"github.com/idemkit/idem/queue","Test":"TestX"}`,
		`# a build error's plain text`,
	}, "\n")
	sum, failed, err := summarise(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := "IDEM_TEST_POSTGRES: skipped 4 suites in 2 packages (httpidem, store/pgstore)\n" +
		"IDEM_TEST_REDIS: skipped 1 suite in 1 package (httpidem)\n"
	if sum != want {
		t.Errorf("summary:\n%s\nwant:\n%s", sum, want)
	}
	if len(failed) != 1 || failed[0] != "queue" {
		t.Errorf("failed = %v, want [queue]", failed)
	}
	if sum, _, _ := summarise(strings.NewReader("")); !strings.HasPrefix(sum, "no suite skipped") {
		t.Errorf("empty summary: %q", sum)
	}
}
