package idemvet_test

import (
	"testing"

	"github.com/idemkit/idem/idemvet"
	"golang.org/x/tools/go/analysis/analysistest"
)

func TestNondetKey(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.NondetKey, "nondet")
}
