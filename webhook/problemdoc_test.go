package webhook

import (
	"testing"

	"github.com/idemkit/idem/internal/problemdoc"
)

// TestProblemDoc checks that docs/problems.md, where the type URIs point,
// documents each problem a Receiver answers with its title.
func TestProblemDoc(t *testing.T) {
	if ProblemTypePrefix != "https://github.com/idemkit/idem/blob/main/docs/problems.md#webhook-" {
		t.Errorf("ProblemTypePrefix = %s", ProblemTypePrefix)
	}
	problemdoc.Check(t, "webhook-", map[string]string{
		"method-not-allowed": "Method not allowed",
		"body-too-large":     "Body too large",
		"body-timeout":       "Body too slow",
		"body-unreadable":    "Body unreadable",
		"signature-invalid":  "Signature invalid",
		"event-id-invalid":   "Event id missing or invalid",
		"in-progress":        "Delivery in progress",
		"capture-failed":     "Event not captured",
		"misconfigured":      "Receiver misconfigured",
		"answer-unreadable":  "Stored answer unreadable",
	})
}
