//go:build !linux

package redisstore

import "os/exec"

// killWithParent does nothing here: the test's cleanups kill the servers.
func killWithParent(*exec.Cmd) {}
