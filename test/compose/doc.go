// Package compose is fairshard's docker compose end-to-end test: the
// repository's own docker-compose.yml, run by a real Docker engine with the
// Compose v2 plugin, scaled out and in under load, with one replica killed,
// and every acknowledged row accounted for. The package has no exported
// API; everything lives in its _test.go files.
//
// # What it owns
//
//   - The test image (Dockerfile.scratch): no registry can be reached where
//     the tests run, so the image is the real Dockerfile's last stage rebuilt
//     FROM scratch around a static binary the test builds (CGO_ENABLED=0),
//     tagged fairshard:local as docker-compose.yml expects. A tag the
//     developer had before is put back at the end.
//   - The scenario (compose_test.go), with the commands a user types:
//     `docker compose up -d --no-build --scale node=N node target` for N =
//     3, 5, 2, then 2 again after a `docker kill` of one replica, and
//     `docker compose --profile demo down -v` (exit 0, every node exits 0). Traffic from the test goes only to published ports on 127.0.0.1;
//     the replicas talk to each other and to the target on the compose
//     network.
//   - Secrets: every run generates a gossip key and hands it to compose
//     through the variable docker-compose.yml reads (FAIRSHARD_GOSSIP_KEY);
//     the init service generates the cluster secret and the API token, and
//     the test reads the token with the command the compose guide gives,
//     then checks that the published API refuses a call without it; see
//     composeSecrets, the one place to extend when secrets change.
//
// # What it does not own
//
// The compose file's static checks (deploy/composecheck, no engine needed),
// the load generator and the delivery target (package loadgen; the target
// runs in its container as `fairshard target`, and the test reads its
// delivered/distinct counts from its log).
//
// # Running
//
// Part of `make test`. It needs dockerd reachable by the docker CLI and the
// Compose v2 plugin (`docker compose version`). Where no engine answers it
// skips, saying so, unless FAIRSHARD_REQUIRE_DOCKER is set (.ci/run sets
// it): then it fails. `-short` skips it. Runs on one machine are
// serialised by a lock file in the temp dir (they share one engine and
// one image tag); each run has its own compose project name and removes
// its containers, network and volume even when it fails; leftovers of a
// run that was killed are removed by the next one.
package compose
