//go:build !linux

package e2e

import "syscall"

// childProcAttr: without Pdeathsig, TestMain's killLeftovers is the only
// guard against a node outliving the run.
func childProcAttr() *syscall.SysProcAttr { return nil }
