package sqlitestore

import (
	"os"
	"testing"

	"github.com/idemkit/idem/internal/testenv"
)

// TestMain runs the package's parallel tests, which mostly wait, eight at
// a time under -short (testenv.RunShortParallel).
func TestMain(m *testing.M) { os.Exit(testenv.RunShortParallel(m)) }
