package composecheck

import (
	"context"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
	"github.com/compose-spec/compose-go/v2/types"

	"github.com/fairshard/fairshard/node"
)

const composeFile = "../../docker-compose.yml"

func load(t *testing.T, profiles ...string) *types.Project {
	t.Helper()
	opts, err := cli.NewProjectOptions([]string{composeFile},
		cli.WithWorkingDirectory("../.."),
		cli.WithProfiles(profiles),
		cli.WithResolvedPaths(true),
		cli.WithInterpolation(true),
		// Give optional variables a value so interpolation is exercised.
		cli.WithEnv([]string{"FAIRSHARD_API_TOKEN=", "FAIRSHARD_GOSSIP_KEY="}),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(context.Background())
	if err != nil {
		t.Fatalf("docker-compose.yml does not load: %v", err)
	}
	return p
}

func TestComposeFileIsValid(t *testing.T) {
	p := load(t, "demo")
	for _, want := range []string{"node", "prometheus", "grafana", "target", "load"} {
		if _, err := p.GetService(want); err != nil {
			t.Fatalf("service %q missing: %v", want, err)
		}
	}
	base := load(t)
	if _, err := base.GetService("load"); err == nil {
		t.Fatal("the load generator must only run under --profile demo")
	}
}

// The node service must scale: no fixed container name or host port, its
// own data slot per replica, a /readyz healthcheck and a drain-long stop
// grace period.
func TestNodeServiceScales(t *testing.T) {
	p := load(t)
	n, err := p.GetService("node")
	if err != nil {
		t.Fatal(err)
	}
	if n.ContainerName != "" {
		t.Fatalf("container_name %q prevents --scale", n.ContainerName)
	}
	for _, port := range n.Ports {
		if port.Published != "" {
			t.Fatalf("published host port %q prevents --scale", port.Published)
		}
	}
	if dir := n.Environment["FAIRSHARD_DATA_DIR"]; dir == nil || !strings.Contains(*dir, "{slot}") {
		t.Fatalf("FAIRSHARD_DATA_DIR must use a {slot} so replicas never share a data dir, got %v", dir)
	}
	if join := n.Environment["FAIRSHARD_JOIN"]; join == nil || !strings.HasPrefix(*join, "node:") {
		t.Fatalf("replicas must join through the service DNS name, FAIRSHARD_JOIN = %v", join)
	}
	if n.HealthCheck == nil || !strings.Contains(strings.Join(n.HealthCheck.Test, " "), "/readyz") {
		t.Fatalf("healthcheck must probe /readyz, got %+v", n.HealthCheck)
	}
	if n.StopGracePeriod == nil || *n.StopGracePeriod < types.Duration(30e9) {
		t.Fatalf("stop_grace_period %v is too short to drain", n.StopGracePeriod)
	}
}

// Every FAIRSHARD_* variable the file sets must be one the binary accepts.
func TestComposeEnvironmentIsKnown(t *testing.T) {
	known := node.KnownEnv()
	p := load(t, "demo")
	for _, s := range p.Services {
		for name := range s.Environment {
			if strings.HasPrefix(name, node.EnvPrefix) && !slices.Contains(known, name) {
				t.Errorf("service %s sets %s, which fairshard does not accept (known: %v)", s.Name, name, known)
			}
		}
	}
}

// Files the compose file mounts must exist.
func TestMountedFilesExist(t *testing.T) {
	for _, f := range []string{
		"deploy/prometheus/prometheus.yml",
		"deploy/grafana/provisioning/datasources/prometheus.yml",
		"deploy/grafana/provisioning/dashboards/fairshard.yml",
		"deploy/grafana/dashboards/fairshard.json",
		"Dockerfile",
	} {
		if _, err := os.Stat(filepath.Join("../..", f)); err != nil {
			t.Errorf("%s: %v", f, err)
		}
	}
}

// Nodes listen beyond loopback in compose, so they need their secrets:
// the one-shot secrets service must complete first and the node must read
// both files it keeps.
func TestNodeGetsSecrets(t *testing.T) {
	p := load(t)
	n, err := p.GetService("node")
	if err != nil {
		t.Fatal(err)
	}
	if d, ok := n.DependsOn["secrets"]; !ok || d.Condition != types.ServiceConditionCompletedSuccessfully {
		t.Fatalf("node must depend on secrets completing successfully, depends_on %+v", n.DependsOn)
	}
	for _, v := range []string{"FAIRSHARD_CLUSTER_SECRET_FILE", "FAIRSHARD_GOSSIP_KEY_FILE", "FAIRSHARD_API_TOKEN_FILE"} {
		if f := n.Environment[v]; f == nil || !strings.HasPrefix(*f, "/secrets/") {
			t.Errorf("node must set %s to a file under /secrets, got %v", v, f)
		}
	}
	// The token comes from the volume only: a second source would make
	// the node refuse to start, and an empty one would leave /v1 open.
	for _, v := range []string{"FAIRSHARD_API_TOKEN", "FAIRSHARD_CLUSTER_SECRET", "FAIRSHARD_GOSSIP_KEY"} {
		if _, set := n.Environment[v]; set {
			t.Errorf("node sets %s: secrets reach it through the files of the secrets service only", v)
		}
	}
	s, err := p.GetService("secrets")
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(s.Command, " ") != "secrets --dir /secrets" {
		t.Errorf("secrets service command %q", s.Command)
	}
}

// Compose must not publish an open API: the API wants the token the
// secrets service keeps (TestNodeGetsSecrets), and every published port
// binds 127.0.0.1 unless FAIRSHARD_PUBLISH_ADDR says otherwise.
func TestPublishedPortsBindLoopback(t *testing.T) {
	p := load(t, "demo")
	for _, s := range p.Services {
		for _, port := range s.Ports {
			if port.HostIP != "127.0.0.1" {
				t.Errorf("service %s publishes %d on %q: want 127.0.0.1 by default", s.Name, port.Target, port.HostIP)
			}
		}
	}
	l, err := p.GetService("load")
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Contains(l.Command, "--api-token-file=/secrets/api-token") {
		t.Errorf("the demo load generator must send the API token: command %q", l.Command)
	}
	mounted := false
	for _, v := range l.Volumes {
		mounted = mounted || (v.Source == "node-secrets" && v.Target == "/secrets" && v.ReadOnly)
	}
	if !mounted {
		t.Errorf("the demo load generator must mount node-secrets read-only at /secrets: %+v", l.Volumes)
	}
}
