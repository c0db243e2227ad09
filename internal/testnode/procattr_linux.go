//go:build linux

package testnode

import "syscall"

// childProcAttr makes the kernel SIGKILL a node if the test process dies
// (a timeout panic, a kill), so no node outlives the run.
func childProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
