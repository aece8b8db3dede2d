package idemvet_test

import (
	"testing"

	"github.com/idemkit/idem/idemvet"
	"golang.org/x/tools/go/analysis/analysistest"
)

func TestDeliveryID(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.DeliveryID, "deliveryid")
}

func TestBodyHash(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.BodyHash, "bodyhash")
}

func TestSwallowed(t *testing.T) {
	analysistest.RunWithSuggestedFixes(t, analysistest.TestData(), idemvet.Swallowed, "swallowed")
}

func TestPartialBatch(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.PartialBatch, "partialbatch")
}

// TestAllow runs every check on the allow fixtures: the silenced findings
// disappear, the comments that silence nothing are reported.
func TestAllow(t *testing.T) {
	analysistest.Run(t, analysistest.TestData(), idemvet.UnusedAllow, "allow")
	analysistest.Run(t, analysistest.TestData(), idemvet.NondetKey, "allowed")
}
