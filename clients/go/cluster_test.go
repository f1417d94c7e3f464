package aaa_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/internal/testserver"
	"google.golang.org/grpc/codes"
)

// closedAddr is an address of 127.0.0.1 that nothing listens on: a port that
// was bound, read and closed.
func closedAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	return addr
}

func dialCluster(t *testing.T, addresses []string, opts ...aaa.Option) *aaa.Client {
	t.Helper()
	client, err := aaa.DialCluster(addresses, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

// startAndReadBack starts runs and reads each back: with round robin, every
// call would meet the server that is down in turn.
func startAndReadBack(t *testing.T, ctx context.Context, client *aaa.Client) {
	t.Helper()
	for range 4 {
		started, err := client.StartRun(ctx, echoRun())
		if err != nil {
			t.Fatalf("StartRun: %v", err)
		}
		run, err := client.GetRun(ctx, started.RunID)
		if err != nil || run.Task != "hello" {
			t.Fatalf("GetRun: %+v, %v", run, err)
		}
		outcome, err := client.Result(ctx, started.RunID)
		if err != nil || outcome.Text != "done" {
			t.Fatalf("Result: %+v, %v", outcome, err)
		}
	}
}

func TestDialClusterSkipsTheServerThatIsDown(t *testing.T) {
	e := setup(t)
	_, port, _ := net.SplitHostPort(e.server.Addr)
	_, closedPort, _ := net.SplitHostPort(closedAddr(t))
	for _, addresses := range [][]string{
		{closedAddr(t), e.server.Addr},
		{net.JoinHostPort("localhost", closedPort), net.JoinHostPort("localhost", port)}, // host names
	} {
		startAndReadBack(t, e.ctx, dialCluster(t, addresses))
	}
}

func TestDialClusterSpreadsCallsOverTheServers(t *testing.T) {
	// Two servers that share nothing: each run stays where it was started,
	// so each one's list shows how many of the calls it got.
	e := setup(t)
	other := testserver.Start(t)
	client := dialCluster(t, []string{e.server.Addr, other.Addr})
	for range 10 {
		if _, err := client.StartRun(e.ctx, echoRun()); err != nil {
			t.Fatalf("StartRun: %v", err)
		}
	}
	var counts []int
	for _, addr := range []string{e.server.Addr, other.Addr} {
		n := 0
		for _, err := range dial(t, addr).ListRuns(e.ctx, aaa.RunFilter{}) {
			if err != nil {
				t.Fatalf("ListRuns: %v", err)
			}
			n++
		}
		counts = append(counts, n)
	}
	// Evenly once both connections are ready; the first calls may all go to the first one ready.
	if counts[0]+counts[1] != 10 || counts[0] == 0 || counts[1] == 0 {
		t.Fatalf("runs per server: %v", counts)
	}
}

func TestDialClusterOfNoServer(t *testing.T) {
	if _, err := aaa.DialCluster(nil); err == nil {
		t.Fatal("DialCluster(nil) made a client")
	}
	client := dialCluster(t, []string{closedAddr(t), closedAddr(t)}, aaa.WithRetryTimeout(0))
	_, err := client.GetRun(context.Background(), "r1")
	var e *aaa.Error
	if !errors.As(err, &e) || e.Code != codes.Unavailable {
		t.Fatalf("GetRun with no server up: %v", err)
	}
}

func TestDialClusterOverTLSWithAToken(t *testing.T) {
	server, p := startTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	_, port, _ := net.SplitHostPort(server.Addr)
	_, closedPort, _ := net.SplitHostPort(closedAddr(t))
	// The certificate names localhost and 127.0.0.1: each address is checked against its own host.
	for _, addresses := range [][]string{
		{closedAddr(t), server.Addr},
		{net.JoinHostPort("localhost", closedPort), net.JoinHostPort("localhost", port)},
	} {
		client := dialCluster(t, addresses, aaa.WithTLS(&tls.Config{RootCAs: p.roots}), aaa.WithToken("runner-token"))
		if actor := startedBy(t, ctx, client); actor.Name != "runner" {
			t.Errorf("actor over TLS with a token = %+v, want runner", actor)
		}
	}
}

// apiCalls returns how many calls of method (e.g. "RunService/Signal") the
// server answered OK, by its Prometheus metrics.
func apiCalls(t *testing.T, server *testserver.Server, method string) int {
	t.Helper()
	resp, err := http.Get("http://" + server.Addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	prefix := `aaa_api_requests_total{method="` + method + `",code="OK"} `
	for line := range strings.Lines(string(body)) {
		if count, ok := strings.CutPrefix(strings.TrimSpace(line), prefix); ok {
			n, err := strconv.Atoi(count)
			if err != nil {
				t.Fatalf("metric %s%s: %v", prefix, count, err)
			}
			return n
		}
	}
	return 0
}

// ownerAndStandby starts two servers of one owner's cluster on PostgreSQL
// (lease 1 s), and a client of both that routes a run's writes to its owner.
func ownerAndStandby(t *testing.T) (owner, standby *testserver.Server, client *aaa.Client) {
	t.Helper()
	if os.Getenv("AAA_TEST_STORE") != "postgres" {
		t.Skip("two servers of one cluster need PostgreSQL (AAA_TEST_STORE=postgres)")
	}
	owner = testserver.StartWith(t, "--one-owner", "--lease-s", "1")
	standby = testserver.StartSharing(t, owner, "--standby", "--lease-s", "1")
	// The standby first: round robin would send it about half of the calls.
	client = dialCluster(t, []string{standby.Addr, owner.Addr})
	if read, routing := aaa.Routing(client); !read || !routing {
		t.Fatalf("the client of a PostgreSQL cluster: owners read %v, routing %v", read, routing)
	}
	return owner, standby, client
}

func TestDialClusterSendsARunsWritesToItsOwner(t *testing.T) {
	owner, standby, client := ownerAndStandby(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	e := &env{server: owner, client: client, ctx: ctx}
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	for range 4 {
		runID := e.start(t, payACME(nil))
		shown := e.requested(t, runID, "")
		if _, err := client.Approve(ctx, runID, shown.CallID, aaa.WithArgumentsSHA256(shown.ArgumentsSHA256)); err != nil {
			t.Fatalf("Approve: %v", err)
		}
		if outcome := e.result(t, runID); outcome.Status != aaa.StatusCompleted {
			t.Fatalf("outcome: %+v", outcome)
		}
	}
	if !aaa.OwnerConnReady(client, owner.Addr) {
		t.Errorf("the client's connection to the owner is not ready: the writes went round robin")
	}
	for _, method := range []string{"RunService/Signal", "WorkerService/CompleteTask"} {
		if n := apiCalls(t, standby, method); n != 0 {
			t.Errorf("the standby answered %d %s calls, want 0", n, method)
		}
		if n := apiCalls(t, owner, method); n != 4 {
			t.Errorf("the owner answered %d %s calls, want 4", n, method)
		}
	}
}

func TestDialClusterWriteWhoseOwnerWasKilledReachesTheNextOwner(t *testing.T) {
	owner, standby, client := ownerAndStandby(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	e := &env{server: standby, client: client, ctx: ctx}
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	runID := e.start(t, payACME(nil))
	shown := e.requested(t, runID, "")
	owner.Kill()
	// The map still names the dead owner: the grant goes there first, fails
	// UNAVAILABLE, and the retry goes round robin to the standby, which
	// takes the runs over within the lease and serves it.
	if _, err := client.Approve(ctx, runID, shown.CallID, aaa.WithArgumentsSHA256(shown.ArgumentsSHA256)); err != nil {
		t.Fatalf("Approve after the owner was killed: %v\nstandby log:\n%s", err, standby.Log())
	}
	if outcome := e.result(t, runID); outcome.Status != aaa.StatusCompleted {
		t.Fatalf("outcome: %+v", outcome)
	}
	if n := ran.Load(); n != 1 {
		t.Errorf("the tool ran %d times, want 1", n)
	}
	if n := apiCalls(t, standby, "WorkerService/CompleteTask"); n != 1 {
		t.Errorf("the standby answered %d CompleteTask calls, want 1", n)
	}
}

func TestDialClusterOfEmbeddedServersDoesNotRoute(t *testing.T) {
	// Separate embedded servers each claim every shard: routing would send a
	// run's writes to a server that does not have the run.
	first := testserver.StartWith(t, "--store", "embedded")
	second := testserver.StartWith(t, "--store", "embedded")
	if read, routing := aaa.Routing(dialCluster(t, []string{first.Addr, second.Addr})); !read || routing {
		t.Fatalf("the client of embedded servers: owners read %v, routing %v", read, routing)
	}
}
