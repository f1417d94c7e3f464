package aaa_test

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"google.golang.org/grpc/codes"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/aaav1"
	"aaa.dev/clients/go/internal/testserver"
)

// pki is a test CA with a server certificate for localhost / 127.0.0.1 and a
// client certificate, the server's files written to a directory.
type pki struct {
	roots  *x509.CertPool
	client tls.Certificate
}

func newPKI(t *testing.T, dir string) pki {
	t.Helper()
	key := func() *ecdsa.PrivateKey {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		return k
	}
	serial := int64(0)
	template := func(cn string) *x509.Certificate {
		serial++
		return &x509.Certificate{
			SerialNumber: big.NewInt(serial),
			Subject:      pkix.Name{CommonName: cn},
			NotBefore:    time.Now().Add(-time.Hour),
			NotAfter:     time.Now().Add(24 * time.Hour),
		}
	}
	sign := func(cert, parent *x509.Certificate, pub *ecdsa.PublicKey, signer *ecdsa.PrivateKey) *x509.Certificate {
		der, err := x509.CreateCertificate(rand.Reader, cert, parent, pub, signer)
		if err != nil {
			t.Fatal(err)
		}
		parsed, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return parsed
	}
	write := func(name, kind string, der []byte) {
		data := pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der})
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	keyDER := func(k *ecdsa.PrivateKey) []byte {
		der, err := x509.MarshalPKCS8PrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return der
	}

	caKey := key()
	caTemplate := template("test-ca")
	caTemplate.IsCA = true
	caTemplate.BasicConstraintsValid = true
	caTemplate.KeyUsage = x509.KeyUsageCertSign
	ca := sign(caTemplate, caTemplate, &caKey.PublicKey, caKey)

	serverKey := key()
	serverTemplate := template("localhost")
	serverTemplate.DNSNames = []string{"localhost"}
	serverTemplate.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	serverTemplate.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
	server := sign(serverTemplate, ca, &serverKey.PublicKey, caKey)

	clientKey := key()
	clientTemplate := template("robot")
	clientTemplate.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	client := sign(clientTemplate, ca, &clientKey.PublicKey, caKey)

	write("ca.pem", "CERTIFICATE", ca.Raw)
	write("server.pem", "CERTIFICATE", server.Raw)
	write("server.key", "PRIVATE KEY", keyDER(serverKey))
	roots := x509.NewCertPool()
	roots.AddCert(ca)
	return pki{
		roots:  roots,
		client: tls.Certificate{Certificate: [][]byte{client.Raw}, PrivateKey: clientKey, Leaf: client},
	}
}

func sha256Hex(data []byte) string {
	sum := sha256.Sum256(data)
	return hex.EncodeToString(sum[:])
}

// startTLS starts a TLS server whose principals are "runner" and "approver"
// (tokens "runner-token", "approver-token"), "robot" (its certificate), and
// the workers "payments" and "intruder" (tokens "payments-token",
// "intruder-token"), both allowed to serve the tool wire_money only.
func startTLS(t *testing.T) (*testserver.Server, pki) {
	t.Helper()
	dir := t.TempDir()
	p := newPKI(t, dir)
	config := fmt.Sprintf(`[tls]
cert = "server.pem"
key = "server.key"
client_ca = "ca.pem"

[[principal]]
name = "runner"
roles = ["runner"]
token_sha256 = "%s"

[[principal]]
name = "approver"
roles = ["approver"]
token_sha256 = "%s"

[[principal]]
name = "robot"
roles = ["runner"]
cert_sha256 = "%s"

[[principal]]
name = "payments"
roles = ["worker"]
tools = ["wire_money"]
token_sha256 = "%s"

[[principal]]
name = "intruder"
roles = ["worker"]
tools = ["wire_money"]
token_sha256 = "%s"
`, sha256Hex([]byte("runner-token")), sha256Hex([]byte("approver-token")), sha256Hex(p.client.Leaf.Raw),
		sha256Hex([]byte("payments-token")), sha256Hex([]byte("intruder-token")))
	path := filepath.Join(dir, "auth.toml")
	if err := os.WriteFile(path, []byte(config), 0o600); err != nil {
		t.Fatal(err)
	}
	return testserver.StartWith(t, "--auth-config", path), p
}

func dialWith(t *testing.T, addr string, opts ...aaa.Option) *aaa.Client {
	t.Helper()
	client, err := aaa.Dial(addr, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { client.Close() })
	return client
}

func echoRun() aaa.StartRunRequest {
	return aaa.StartRunRequest{Task: "hello", Model: aaa.ScriptedModel(aaa.TextStep("done"))}
}

func startedBy(t *testing.T, ctx context.Context, client *aaa.Client) aaa.Actor {
	t.Helper()
	run, err := client.StartRun(ctx, echoRun())
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	for event, err := range client.Events(ctx, run.RunID, aaa.EventsOptions{}) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		return event.Actor
	}
	t.Fatal("no events")
	return aaa.Actor{}
}

func TestTokenAndClientCertificateOverTLS(t *testing.T) {
	server, p := startTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()

	runner := dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots}), aaa.WithToken("runner-token"))
	if actor := startedBy(t, ctx, runner); actor.Name != "runner" {
		t.Errorf("actor of a token caller = %+v, want runner", actor)
	}
	robot := dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots, Certificates: []tls.Certificate{p.client}}))
	if actor := startedBy(t, ctx, robot); actor.Name != "robot" {
		t.Errorf("actor of a certificate caller = %+v, want robot", actor)
	}

	anonymous := dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots}))
	_, err := anonymous.StartRun(ctx, echoRun())
	if !errors.Is(err, aaa.ErrUnauthenticated) {
		t.Errorf("StartRun without credentials: %v, want ErrUnauthenticated", err)
	}
	approver := dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots}), aaa.WithToken("approver-token"))
	_, err = approver.StartRun(ctx, echoRun())
	var e *aaa.Error
	if !errors.Is(err, aaa.ErrPermissionDenied) || !errors.As(err, &e) || e.Metadata["roles"] != "runner,admin" {
		t.Errorf("StartRun as approver: %v, want ErrPermissionDenied naming runner,admin", err)
	}
}

// A worker principal serves only the tools its auth config lists, and a
// worker identity belongs to the principal that first used it.
func TestWorkerPrincipalServesOnlyItsToolsUnderAnIdentityItOwns(t *testing.T) {
	server, p := startTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dialAs := func(token string) *aaa.Client {
		return dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots}), aaa.WithToken(token))
	}
	payments, intruder, runner := dialAs("payments-token"), dialAs("intruder-token"), dialAs("runner-token")
	echoTool := func(name string) aaa.Tool {
		return aaa.Tool{Name: name, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
			return task.Arguments, nil
		}}
	}
	wireMoney := echoTool("wire_money")

	// A tool the principal's tools do not list.
	_, err := aaa.NewWorker(payments, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{echoTool("send_email")}}).Register(ctx)
	if e := wantReason(t, err, aaa.ErrNotAllowedToServe); e.Code != codes.PermissionDenied || e.Metadata["tool"] != "send_email" {
		t.Errorf("Register send_email as payments: %v (metadata %v), want PERMISSION_DENIED naming the tool", err, e.Metadata)
	}

	// payments-1 is payments' from its first use on: intruder may not
	// register or poll as it, even for a tool intruder may serve.
	serveWith(t, ctx, payments, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{wireMoney}})
	_, err = aaa.NewWorker(intruder, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{wireMoney}}).Register(ctx)
	if e := wantReason(t, err, aaa.ErrIdentityTaken); e.Code != codes.PermissionDenied || e.Metadata["identity"] != "payments-1" {
		t.Errorf("Register as payments-1 by intruder: %v (metadata %v), want PERMISSION_DENIED naming the identity", err, e.Metadata)
	}
	poll := &aaav1.PollTaskRequest{Identity: "payments-1", Tools: []string{"wire_money"}, WaitS: 0.1}
	_, err = intruder.WorkerService().PollTask(ctx, poll)
	if e := wantReason(t, aaa.FromGRPC(err), aaa.ErrIdentityTaken); e.Metadata["identity"] != "payments-1" {
		t.Errorf("PollTask as payments-1 by intruder: metadata %v, want the identity", e.Metadata)
	}

	// The owner serves a run; the events name its identity and its principal.
	run, err := runner.StartRun(ctx, aaa.StartRunRequest{
		Task:  "pay",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "wire_money", Arguments: map[string]int{"amount": 5}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "wire_money"}},
	})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	outcome, err := runner.Result(ctx, run.RunID)
	if err != nil || outcome.Status != aaa.StatusCompleted {
		t.Fatalf("Result: %+v, %v", outcome, err)
	}
	actors := map[string]aaa.Actor{}
	for event, err := range runner.Events(ctx, run.RunID, aaa.EventsOptions{}) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		actors[event.Type] = event.Actor
	}
	if got, want := actors["aaa.tool.completed"], (aaa.Actor{Kind: aaa.ActorWorker, Name: "payments-1", Principal: "payments"}); got != want {
		t.Errorf("actor of aaa.tool.completed = %+v, want %+v", got, want)
	}
	if got, want := actors["aaa.run.started"], (aaa.Actor{Kind: aaa.ActorClient, Name: "runner"}); got != want {
		t.Errorf("actor of aaa.run.started = %+v, want %+v", got, want)
	}
}

// With auth on, a vote counts for the authenticated principal, and only an
// approver may decide a batch.
func TestApproverIsThePrincipal(t *testing.T) {
	server, p := startTLS(t)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	defer cancel()
	dialAs := func(token string) *aaa.Client {
		return dialWith(t, server.Addr, aaa.WithTLS(&tls.Config{RootCAs: p.roots}), aaa.WithToken(token))
	}
	payments, runner, approver := dialAs("payments-token"), dialAs("runner-token"), dialAs("approver-token")
	gated := aaa.Tool{Name: "wire_money", RequiresApproval: true, Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) {
		return "sent", nil
	}}
	serveWith(t, ctx, payments, aaa.WorkerOptions{Identity: "payments-1", Tools: []aaa.Tool{gated}})
	run, err := runner.StartRun(ctx, aaa.StartRunRequest{
		Task:  "pay",
		Model: aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: "wire_money", Arguments: map[string]int{"amount": 5}}), aaa.EchoStep()),
		Tools: []aaa.ToolRef{{Name: "wire_money", ApprovalsRequired: 2}},
	})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	var shown aaa.Approval
	for update, err := range approver.WatchApprovals(ctx, aaa.WatchOptions{ApprovalFilter: aaa.ApprovalFilter{RunID: run.RunID}}) {
		if err != nil {
			t.Fatalf("WatchApprovals: %v", err)
		}
		if update.Kind == aaa.Requested {
			shown = *update.Approval
			break
		}
	}

	_, err = approver.Approve(ctx, run.RunID, shown.CallID, aaa.WithApprover("someone-else"))
	if e := wantReason(t, err, aaa.ErrInvalidField); e.Field() != "data_json.approver" {
		t.Errorf("a grant naming another approver: %v", err)
	}
	_, err = runner.DecideApprovals(ctx, []aaa.DecisionItem{shown.DecisionItem()}, aaa.BatchGrant)
	wantReason(t, err, aaa.ErrPermissionDenied)

	results, err := approver.DecideApprovals(ctx, []aaa.DecisionItem{shown.DecisionItem()}, aaa.BatchGrant)
	if err != nil || results[0].Status != aaa.DecisionDecided || results[0].Decision != aaa.EventApprovalVoted {
		t.Fatalf("a batch grant: %+v, %v", results, err)
	}
	// The same principal again, whatever name it gives, is the same approver.
	results, err = approver.DecideApprovals(ctx, []aaa.DecisionItem{shown.DecisionItem()}, aaa.BatchGrant, aaa.WithApprover("approver"))
	if err != nil || results[0].Status != aaa.DecisionAlreadyDecided || results[0].ErrorReason != aaa.ErrAlreadyVoted {
		t.Fatalf("a second batch grant by the same approver: %+v, %v", results, err)
	}
	var votes []aaa.Vote
	for pending, err := range approver.ListApprovals(ctx, aaa.ApprovalFilter{RunID: run.RunID}) {
		if err != nil {
			t.Fatal(err)
		}
		votes = append(votes, pending.Votes...)
	}
	if len(votes) != 1 || votes[0].Approver != "approver" {
		t.Fatalf("votes: %+v", votes)
	}
}
