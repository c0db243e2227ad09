# The README's commands. `make test` is the gate CI runs (.ci/run);
# CONTRIBUTING.md describes the tiers.
GO ?= go

.PHONY: test test-long test-short bench demo build chaos-long

# Packages that run on their own, after the others: the compose test (a
# Docker engine with 5 replicas), the docker-compose.yml check (its own
# module: compose-go stays out of the product's dependencies) and the
# soak (it loads both cores).
# Each gate step prints its duration (scripts/timed.sh).
TIMED := ./scripts/timed.sh

SOLO := -e '/test/compose$$' -e '/test/chaos$$'

# The packages that hold benchmarks (found, so a new one is picked up):
# the gate's benchmark step builds only their test binaries, not every
# package's (nor runs the TestMains of e2e, compose and chaos, which build
# node binaries).
BENCH_PKGS = $$(grep -rl --include='*_test.go' --exclude-dir=deploy '^func Benchmark' . | xargs -n1 dirname | sort -u)

# boltstore's volume tests (volumeTest in boltstore/volume_test.go): the
# gate runs them without -race.
VOLUME := ^(TestFileGrowthUnderChurn|TestTombstonesGiveBackTheirPages)$$

## test: the gate, one step after another. Every package with the race
## detector, the e2e suite included and listed first (go test starts
## packages in the order given: the longest one then overlaps the others;
## its node processes plain-built: test/e2e/doc.go); boltstore again
## without -race, for its volume tests (file growth over 200,000 rows:
## under -race they run only in test-long); every benchmark once
## (-benchtime=1x, -short; only the packages that have one) so their
## checks cannot rot (both -vet=off: the
## first step vetted the same code); the compose end-to-end test (after
## FAIRSHARD_BEFORE_COMPOSE, if set: .ci/run waits there for the Compose
## plugin it builds in the background); the docker-compose.yml check; the
## 2-minute soak. Volume scenarios are skipped (make test-long). The steps
## do not run side by side: on two cores the extra load makes gossip-timed
## tests fail (CONTRIBUTING.md "Test tiers").
##
## The tests' files (TMPDIR: node data dirs, bbolt files, test binaries)
## go to GATE_TMPDIR, a tmpfs where the machine has one (/dev/shm): the
## gate asserts counts, not fsync latency, and on this 2-core VM the
## fsyncs cost a tenth of its CPU. GATE_TMPDIR= (empty) keeps the default
## temporary directory; the benchmarks of docs/BENCHMARKS.md (make bench)
## and make test-long run on disk.
GATE_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm/fairshard-gate)
test: export TMPDIR := $(if $(GATE_TMPDIR),$(GATE_TMPDIR),$(TMPDIR))
test:
	@if [ -n "$(GATE_TMPDIR)" ]; then mkdir -p "$(GATE_TMPDIR)" && echo "== TMPDIR=$(GATE_TMPDIR)"; fi
	$(TIMED) packages $(GO) test -race -count=1 -timeout 20m ./test/e2e $$($(GO) list ./... | grep -v -e '/test/e2e$$' $(SOLO))
	$(TIMED) volume $(GO) test -vet=off -count=1 -timeout 10m -run '$(VOLUME)' ./boltstore
	$(TIMED) benchmarks $(GO) test -vet=off -short -count=1 -timeout 10m -run '^$$' -bench . -benchtime=1x $(BENCH_PKGS)
	$(TIMED) compose-plugin $${FAIRSHARD_BEFORE_COMPOSE:-true}
	$(TIMED) compose $(GO) test -race -count=1 -timeout 15m ./test/compose
	cd deploy/composecheck && $(GO) test -count=1 ./...
	$(TIMED) chaos $(GO) test -race -count=1 -timeout 15m ./test/chaos

## test-long: the volume scenarios (boltstore's under -race, a million pending rows synced on a
## join, 1 MiB rows (500 through a graceful leave: node), 200 MiB of dead letters, a kill in the middle of a
## shard sync, a 60 s partition), the e2e suite with race-built node
## processes (FAIRSHARD_RACE_NODES=1) and the 12-minute soak. Run it before
## resolving anything that touches what they cover; their figures are in
## docs/BENCHMARKS.md.
test-long:
	FAIRSHARD_LONG=1 $(GO) test -race -count=1 -timeout 20m -run '$(VOLUME)' ./boltstore
	FAIRSHARD_LONG=1 $(GO) test -race -count=1 -timeout 20m -run TestHandoffMovesLargeRows ./node
	FAIRSHARD_RACE_NODES=1 $(GO) test -race -count=1 -timeout 30m ./test/e2e
	FAIRSHARD_LONG=1 $(GO) test -race -count=1 -timeout 40m -run 'TestReplication|TestDeadLetter' ./test/e2e
	FAIRSHARD_LONG=1 $(GO) test -race -count=1 -timeout 15m -run TestReplicationPartition ./test/chaos
	CHAOS_DURATION=$${CHAOS_DURATION:-12m} $(GO) test -race -count=1 -timeout $${CHAOS_TIMEOUT:-60m} -v -run 'TestChaos$$' ./test/chaos

## chaos-long: the 30-minute soak recorded in docs/BENCHMARKS.md
## (CHAOS_DURATION and CHAOS_SEED change it; CHAOS_TIMEOUT must leave the
## end drain room, up to the duration again: twice it plus 20 minutes).
chaos-long:
	CHAOS_DURATION=$${CHAOS_DURATION:-30m} $(GO) test -race -count=1 -timeout $${CHAOS_TIMEOUT:-90m} -v -run 'TestChaos$$' ./test/chaos

## test-short: the fast unit tests only (skips crash and e2e tests).
test-short:
	$(GO) test -race -short -count=1 ./...

## bench: the benchmarks recorded in docs/BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

# REVISION is the commit `fairshard version` reports when the toolchain
# records none (GOFLAGS=-buildvcs=false, a tree without .git).
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null)
build:
	$(GO) build -ldflags "-X main.revision=$(REVISION)" -o bin/fairshard ./cmd/node
