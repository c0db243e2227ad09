# The README's commands. `make test` is the gate CI runs (.ci/run);
# CONTRIBUTING.md describes the tiers.
GO ?= go

.PHONY: test test-long test-short bench demo build chaos-long

# Packages the package step leaves out: the compose test (a Docker engine
# with 5 replicas) and the docker-compose.yml check (its own module:
# compose-go stays out of the product's dependencies) run in the compose
# lane beside it; the soak runs alone at the end (it loads both cores).
# Each gate step prints its duration (scripts/timed.sh).
TIMED := ./scripts/timed.sh

SOLO := -e '/test/compose$$' -e '/test/chaos$$'

# boltstore's volume tests (volumeTest in boltstore/volume_test.go): the
# gate runs them without -race.
VOLUME := ^(TestFileGrowthUnderChurn|TestTombstonesGiveBackTheirPages)$$

## test: the gate, in three phases. (1) Every package with the race
## detector, the e2e suite included and listed first (go test starts
## packages in the order given: the longest one then overlaps the others;
## its node processes plain-built, its count-only scenarios three at a
## time: test/e2e/doc.go), beside the compose lane: the compose end-to-end
## test (after FAIRSHARD_BEFORE_COMPOSE, if set: .ci/run waits there for
## the Compose plugin it builds in the background) and the
## docker-compose.yml check. (2) boltstore again without -race, for its
## volume tests (file growth over 200,000 rows: under -race they run only
## in test-long), beside every benchmark once (-benchtime=1x, -short) so
## their checks cannot rot (both -vet=off: phase 1 vetted the same code).
## (3) The 2-minute soak, alone: it loads both cores. Volume scenarios are
## skipped (make test-long). The benchmarks stay out of phase 1: beside
## the package lane they push the load past what the gossip tests of
## cluster and the e2e read-back bounds tolerate (CONTRIBUTING.md "Test
## tiers").
##
## The tests' files (TMPDIR: node data dirs, bbolt files, test binaries)
## go to GATE_TMPDIR, a tmpfs where the machine has one (/dev/shm): the
## gate asserts counts, not fsync latency, and on this 2-core VM the
## fsyncs cost a tenth of its CPU. GATE_TMPDIR= (empty) keeps the default
## temporary directory; the benchmarks of docs/BENCHMARKS.md (make bench)
## and make test-long run on disk.
GATE_TMPDIR ?= $(if $(wildcard /dev/shm/.),/dev/shm/fairshard-gate)
GATE := $(MAKE) --no-print-directory -j2

test: export TMPDIR := $(if $(GATE_TMPDIR),$(GATE_TMPDIR),$(TMPDIR))
test:
	@if [ -n "$(GATE_TMPDIR)" ]; then mkdir -p "$(GATE_TMPDIR)" && echo "== TMPDIR=$(GATE_TMPDIR)"; fi
	$(GATE) gate-packages gate-compose
	$(GATE) gate-volume gate-benchmarks
	$(TIMED) chaos $(GO) test -race -count=1 -timeout 15m ./test/chaos

.PHONY: gate-packages gate-compose gate-volume gate-benchmarks
gate-packages:
	$(TIMED) packages $(GO) test -race -count=1 -timeout 20m -parallel 3 ./test/e2e $$($(GO) list ./... | grep -v -e '/test/e2e$$' $(SOLO))

gate-compose:
	$(TIMED) compose-plugin $${FAIRSHARD_BEFORE_COMPOSE:-true}
	$(TIMED) compose $(GO) test -race -count=1 -timeout 15m ./test/compose
	cd deploy/composecheck && $(GO) test -count=1 ./...

gate-volume:
	$(TIMED) volume $(GO) test -vet=off -count=1 -timeout 10m -run '$(VOLUME)' ./boltstore

gate-benchmarks:
	$(TIMED) benchmarks $(GO) test -vet=off -short -count=1 -timeout 10m -run '^$$' -bench . -benchtime=1x ./...

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
## end drain room: 30 minutes more than the duration).
chaos-long:
	CHAOS_DURATION=$${CHAOS_DURATION:-30m} $(GO) test -race -count=1 -timeout $${CHAOS_TIMEOUT:-90m} -v -run 'TestChaos$$' ./test/chaos

## test-short: the fast unit tests only (skips crash and e2e tests).
test-short:
	$(GO) test -race -short -count=1 ./...

## bench: the benchmarks recorded in docs/BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

build:
	$(GO) build -o bin/fairshard ./cmd/node
