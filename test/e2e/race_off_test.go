//go:build !race

package e2e

// slowdown: plain builds; deadlines as written (deadline).
const slowdown = 1
