package idemtest

import (
	"os"
	"testing"
)

// Environment of a child process of the suite.
const (
	envRole = "IDEMTEST_CHILD_ROLE" // the part the child plays
)

// runChild plays the part of a child process named by the environment.
func runChild(t *testing.T, h Harness) {
	t.Fatalf("idemtest: unknown child role %q", os.Getenv(envRole))
}
