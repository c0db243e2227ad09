//go:build !linux

package testnode

import "syscall"

// childProcAttr: without Pdeathsig, KillAll (in TestMain) is the only
// guard against a node outliving the run.
func childProcAttr() *syscall.SysProcAttr { return nil }
