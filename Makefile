# The README's commands. `make test` is what CI runs.
GO ?= go

.PHONY: test test-short bench demo build

## test: every package with the race detector, the e2e suite included;
## then the compose end-to-end test on its own (a Docker engine with 5
## replicas; it skips where no engine answers, see README); then the
## docker-compose.yml check (its own module: compose-go stays out of the
## product's dependencies).
test:
	$(GO) test -race -count=1 -timeout 20m $$($(GO) list ./... | grep -v '/test/compose$$')
	$(GO) test -race -count=1 -timeout 15m ./test/compose
	cd deploy/composecheck && $(GO) test -count=1 ./...

## test-short: the fast unit tests only (skips crash and e2e tests).
test-short:
	$(GO) test -race -short -count=1 ./...

## bench: the benchmarks recorded in docs/BENCHMARKS.md.
bench:
	$(GO) test -run '^$$' -bench . -benchmem ./...

build:
	$(GO) build -o bin/fairshard ./cmd/node
