package redisstore

import (
	"os/exec"
	"syscall"
)

// killWithParent makes cmd's process get SIGKILL when the test process
// dies, so that a test killed before its cleanups leaves no server behind.
func killWithParent(cmd *exec.Cmd) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
