package main

import (
	"testing"

	"github.com/idemkit/idem/internal/problemdoc"
)

// TestServeProblemDoc checks that docs/problems.md, where the type URIs
// point, documents each problem idem serve answers with its title.
func TestServeProblemDoc(t *testing.T) {
	if problemBase != "https://github.com/idemkit/idem/blob/main/docs/problems.md#serve-" {
		t.Errorf("problemBase = %s", problemBase)
	}
	problemdoc.Check(t, "serve-", problemTitles)
}
