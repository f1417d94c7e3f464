package aaa_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"

	aaa "aaa.dev/clients/go"
	"aaa.dev/clients/go/internal/testserver"
)

// testPolicy allows small refunds. Tool names are fixed: the policy names them.
const testPolicy = `
[[rule]]
name = "small-refunds"
when = 'tool == "refund" && args.amount < 100'
decide = "allow"
`

// policyEnv is a server with auth and a policy file, and a client for each
// principal: admin serves the tools and starts the runs, alice is a finance
// approver, carol an approver in no group.
type policyEnv struct {
	server              *testserver.Server
	file                string
	admin, alice, carol *aaa.Client
	ctx                 context.Context
}

func startPolicy(t *testing.T) *policyEnv {
	t.Helper()
	dir := t.TempDir()
	var auth strings.Builder
	for _, p := range []struct{ name, roles, groups string }{
		{"admin", `["admin"]`, `[]`},
		{"alice", `["approver"]`, `["finance"]`},
		{"carol", `["approver"]`, `[]`},
	} {
		fmt.Fprintf(&auth, "[[principal]]\nname = %q\nroles = %s\ngroups = %s\ntoken_sha256 = %q\n\n",
			p.name, p.roles, p.groups, sha256Hex([]byte(p.name+"-token")))
	}
	authFile, policyFile := filepath.Join(dir, "auth.toml"), filepath.Join(dir, "policy.toml")
	writeFile(t, authFile, auth.String())
	writeFile(t, policyFile, testPolicy)
	server := testserver.StartWith(t, "--auth-config", authFile, "--policy", policyFile)
	ctx, cancel := context.WithTimeout(context.Background(), testTimeout)
	t.Cleanup(cancel)
	as := func(name string) *aaa.Client { return dialWith(t, server.Addr, aaa.WithToken(name+"-token")) }
	return &policyEnv{server: server, file: policyFile, admin: as("admin"), alice: as("alice"), carol: as("carol"), ctx: ctx}
}

func writeFile(t *testing.T, path, text string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		t.Fatal(err)
	}
}

// gatedTool is a gated tool that answers "NAME done".
func gatedTool(name string, approvers ...string) aaa.Tool {
	return aaa.Tool{Name: name, RequiresApproval: true, Approvers: approvers,
		Handler: func(ctx context.Context, task *aaa.ToolTask) (any, error) { return name + " done", nil }}
}

// callOnce starts a run (as admin) that calls the tool once and echoes its result.
func (p *policyEnv) callOnce(t *testing.T, tool string, labels map[string]string) string {
	t.Helper()
	run, err := p.admin.StartRun(p.ctx, aaa.StartRunRequest{
		Task:   "call " + tool,
		Model:  aaa.ScriptedModel(aaa.CallStep(aaa.ToolCallRequest{Name: tool, Arguments: map[string]int{"amount": 5}}), aaa.EchoStep()),
		Tools:  []aaa.ToolRef{{Name: tool}},
		Labels: labels,
	})
	if err != nil {
		t.Fatalf("StartRun: %v", err)
	}
	return run.RunID
}

// pending lists the pending requests the client sees, by tool.
func pending(t *testing.T, ctx context.Context, client *aaa.Client, filter aaa.ApprovalFilter) map[string]aaa.Approval {
	t.Helper()
	byTool := map[string]aaa.Approval{}
	for a, err := range client.ListApprovals(ctx, filter) {
		if err != nil {
			t.Fatalf("ListApprovals: %v", err)
		}
		byTool[a.Tool] = a
	}
	return byTool
}

func TestApproverGroupsDecideTheirToolsCalls(t *testing.T) {
	p := startPolicy(t)
	serveWith(t, p.ctx, p.admin, aaa.WorkerOptions{Tools: []aaa.Tool{gatedTool("pay", "finance"), gatedTool("lookup")}})
	labels := map[string]string{"test": t.Name()}
	paying, looking := p.callOnce(t, "pay", labels), p.callOnce(t, "lookup", labels)
	for _, runID := range []string{paying, looking} {
		opts := aaa.EventsOptions{Follow: true, StopAtEnd: true, TypePrefix: aaa.EventApprovalRequested}
		for _, err := range p.admin.Events(p.ctx, runID, opts) {
			if err != nil {
				t.Fatalf("Events: %v", err)
			}
			break
		}
	}

	// Everyone sees both; Decidable keeps those the caller may decide.
	shown := pending(t, p.ctx, p.carol, aaa.ApprovalFilter{Labels: labels})
	if !slices.Equal(shown["pay"].Approvers, []string{"finance"}) || len(shown["lookup"].Approvers) != 0 {
		t.Fatalf("approvers of the requests: %+v", shown)
	}
	decidable := aaa.ApprovalFilter{Labels: labels, Decidable: true}
	if got := pending(t, p.ctx, p.carol, decidable); len(got) != 1 || got["lookup"].CallID == "" {
		t.Fatalf("carol may decide %+v, want lookup only", got)
	}
	if got := pending(t, p.ctx, p.alice, decidable); len(got) != 2 {
		t.Fatalf("alice may decide %+v, want both", got)
	}
	var watched []aaa.ApprovalUpdate
	for update, err := range p.carol.WatchApprovals(p.ctx, aaa.WatchOptions{ApprovalFilter: decidable}) {
		if err != nil {
			t.Fatalf("WatchApprovals: %v", err)
		}
		watched = append(watched, update)
		if update.Kind == aaa.SnapshotComplete {
			break
		}
	}
	if len(watched) != 2 || watched[0].Approval.Tool != "lookup" || watched[1].Pending != 1 {
		t.Fatalf("carol's decidable snapshot: %+v", watched)
	}

	// Carol is not in finance: refused, alone or in a batch.
	payment := shown["pay"]
	_, err := p.carol.Approve(p.ctx, paying, payment.CallID, aaa.WithArgumentsSHA256(payment.ArgumentsSHA256))
	e := wantReason(t, err, aaa.ErrNotAnApproverForCall)
	if e.Code != codes.PermissionDenied || !slices.Equal(e.Groups(), []string{"finance"}) || e.Metadata["call_id"] != payment.CallID {
		t.Fatalf("carol's grant: %v (groups %v, metadata %v)", err, e.Groups(), e.Metadata)
	}
	_, err = p.carol.Edit(p.ctx, paying, payment.CallID, map[string]int{"amount": 4})
	wantReason(t, err, aaa.ErrNotAnApproverForCall)
	results, err := p.carol.DecideApprovals(p.ctx, []aaa.DecisionItem{payment.DecisionItem()}, aaa.BatchGrant)
	if err != nil || results[0].Status != aaa.DecisionRefused || results[0].ErrorReason != aaa.ErrNotAnApproverForCall {
		t.Fatalf("carol's batch: %+v, %v", results, err)
	}

	// Alice is: her grant runs the call; carol may grant the call that names no group.
	granted, err := p.alice.Approve(p.ctx, paying, payment.CallID, aaa.WithArgumentsSHA256(payment.ArgumentsSHA256))
	if err != nil || granted.Decision != aaa.EventApprovalGranted || granted.AlreadyDecided {
		t.Fatalf("alice's grant: %+v, %v", granted, err)
	}
	if _, err := p.carol.Approve(p.ctx, looking, shown["lookup"].CallID); err != nil {
		t.Fatalf("carol's grant of lookup: %v", err)
	}
	for runID, want := range map[string]string{paying: "pay done", looking: "lookup done"} {
		if outcome, err := p.admin.Result(p.ctx, runID); err != nil || outcome.Text != want {
			t.Fatalf("outcome: %+v, %v; want %q", outcome, err, want)
		}
	}
}

func TestPolicyRuleGrantsACall(t *testing.T) {
	p := startPolicy(t)
	serveWith(t, p.ctx, p.admin, aaa.WorkerOptions{Tools: []aaa.Tool{gatedTool("refund")}})
	runID := p.callOnce(t, "refund", nil)
	if outcome, err := p.admin.Result(p.ctx, runID); err != nil || outcome.Text != "refund done" {
		t.Fatalf("outcome: %+v, %v", outcome, err)
	}
	var granted []aaa.Event
	for event, err := range p.admin.Events(p.ctx, runID, aaa.EventsOptions{}) {
		if err != nil {
			t.Fatalf("Events: %v", err)
		}
		if event.Type == aaa.EventApprovalRequested {
			t.Fatalf("the policy allows the call, yet it was requested: %+v", event)
		}
		if event.Type == aaa.EventApprovalGranted {
			granted = append(granted, event)
		}
	}
	if len(granted) != 1 || granted[0].Actor != (aaa.Actor{Kind: aaa.ActorPolicy, Name: "small-refunds"}) {
		t.Fatalf("grants: %+v", granted)
	}
	var data struct{ Policy struct{ Rule, SHA256 string } }
	if err := granted[0].Decode(&data); err != nil {
		t.Fatal(err)
	}
	if data.Policy.Rule != "small-refunds" || data.Policy.SHA256 != sha256Hex([]byte(testPolicy)) {
		t.Fatalf("the grant's policy: %+v", data.Policy)
	}
}

func TestGetAndReloadPolicy(t *testing.T) {
	p := startPolicy(t)
	policy, err := p.carol.GetPolicy(p.ctx)
	want := aaa.Policy{Loaded: true, SHA256: sha256Hex([]byte(testPolicy)), Rules: []string{"small-refunds"}, File: p.file}
	if err != nil || !reflect.DeepEqual(policy, want) {
		t.Fatalf("GetPolicy: %+v, %v; want %+v", policy, err, want)
	}
	_, err = p.carol.ReloadPolicy(p.ctx)
	wantReason(t, err, aaa.ErrPermissionDenied)

	// A file that does not check is refused; the policy in force stays.
	writeFile(t, p.file, "[[rule]]\nname = \"r\"\nwhen = 'amount > 1'\ndecide = \"allow\"\n")
	_, err = p.admin.ReloadPolicy(p.ctx)
	if e := wantReason(t, err, aaa.ErrInvalidField); !strings.Contains(e.Message, "rule 1 ('r')") {
		t.Fatalf("a bad policy: %v", err)
	}
	if same, err := p.carol.GetPolicy(p.ctx); err != nil || same.SHA256 != policy.SHA256 {
		t.Fatalf("after a refused reload: %+v, %v", same, err)
	}

	changed := "[[rule]]\nname = \"refunds\"\nwhen = 'tool == \"refund\"'\ndecide = \"allow\"\n"
	writeFile(t, p.file, changed)
	reloaded, err := p.admin.ReloadPolicy(p.ctx)
	if err != nil || !reloaded.Loaded || reloaded.SHA256 != sha256Hex([]byte(changed)) || !slices.Equal(reloaded.Rules, []string{"refunds"}) {
		t.Fatalf("ReloadPolicy: %+v, %v", reloaded, err)
	}
	if now, err := p.carol.GetPolicy(p.ctx); err != nil || !reflect.DeepEqual(now, reloaded) {
		t.Fatalf("GetPolicy after the reload: %+v, %v", now, err)
	}
}

func TestNoPolicy(t *testing.T) {
	e := setup(t)
	if policy, err := e.client.GetPolicy(e.ctx); err != nil || !reflect.DeepEqual(policy, aaa.Policy{}) {
		t.Fatalf("GetPolicy without a policy: %+v, %v", policy, err)
	}
	_, err := e.client.ReloadPolicy(e.ctx)
	wantReason(t, err, aaa.ErrInvalidField)
}
