package httpidem

import (
	"testing"

	"github.com/idemkit/idem/internal/problemdoc"
)

// TestProblemDoc checks that docs/problems.md, where the type URIs point,
// documents each problem the middleware answers with its title.
func TestProblemDoc(t *testing.T) {
	if DefaultProblemBase != "https://github.com/idemkit/idem/blob/main/docs/problems.md#httpidem-" {
		t.Errorf("DefaultProblemBase = %s", DefaultProblemBase)
	}
	problemdoc.Check(t, "httpidem-", problemTitles)
}
