package main

import (
	"context"
	"strings"
	"testing"
)

// TestPasswordNeverPrinted: a password that should have been
// percent-encoded, or in a URL without its "//", is not printed in the
// command's message.
func TestPasswordNeverPrinted(t *testing.T) {
	ctx := context.Background()
	for _, raw := range []string{
		"postgres://u:qz/vk@127.0.0.1:1/db",
		"redis://u:qz/vk@127.0.0.1:1/0",
		"redis://u:qz#vk@127.0.0.1:1/0",
		"postgres://u:qz?vk@127.0.0.1:1/db?connect_timeout=2",
		"postgres:u:qz/vk@db.internal/billing",
		"u:qz/vk@db.internal/billing",
	} {
		r := idemRun(ctx, "--store", raw, "ls")
		if r.code == 0 {
			t.Errorf("--store %s: exit 0", raw)
		}
		if strings.Contains(r.stdout+r.stderr, "qz") {
			t.Errorf("--store %s: the password (or a piece of it) is printed:\n%s", raw, r)
		}
	}
}
