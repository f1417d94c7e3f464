package aaa_test

import (
	"maps"
	"sync/atomic"
	"testing"
	"time"

	aaa "aaa.dev/clients/go"
)

// Standing grants: a grant made in advance lets matching calls run (actor
// kind grant), counts its uses, stops when used up or revoked, and refuses
// bad input by field.

func TestGrantLetsMatchingCallsRunUntilUsedUp(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})
	labels := map[string]string{"test": t.Name()}

	_, err := e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{Tool: "wire_money", Reason: "x", Condition: "args.amount <"})
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "condition" {
		t.Fatalf("field %q, want condition", got.Field())
	}
	grant, err := e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{
		Tool: "wire_money", Reason: "payroll day", Labels: labels,
		Condition: "args.amount < 1000", ExpiresIn: time.Hour, MaxUses: 1,
		RequestID: "grant-" + t.Name(),
	})
	if err != nil {
		t.Fatal(err)
	}
	if !grant.Active || grant.Uses != 0 || grant.UsesLeft == nil || *grant.UsesLeft != 1 || !maps.Equal(grant.Labels, labels) {
		t.Fatalf("new grant: %+v", grant)
	}
	if grant.ID == "" || grant.Tool != "wire_money" || grant.MaxUses != 1 || grant.Reason != "payroll day" || grant.Condition != "args.amount < 1000" {
		t.Fatalf("new grant: %+v", grant)
	}
	if !grant.ExpiresAt.After(time.Now()) || grant.CreatedAt.IsZero() || !grant.RevokedAt.IsZero() {
		t.Fatalf("new grant's times: %+v", grant)
	}

	runID := e.start(t, payACME(labels))
	if outcome := e.result(t, runID); outcome.Text != "sent $250 to ACME" {
		t.Fatalf("the model read: %q", outcome.Text)
	}
	if ran.Load() != 1 {
		t.Fatalf("the tool ran %d times", ran.Load())
	}
	granted := ofType(e.events(t, runID), aaa.EventApprovalGranted)
	if len(granted) != 1 || granted[0].Actor.Kind != aaa.ActorGrant || granted[0].Actor.Name != grant.ID {
		t.Fatalf("granted events: %+v", granted)
	}
	if g, _ := decode(t, granted[0])["grant"].(map[string]any); g["reason"] != "payroll day" {
		t.Fatalf("granted data: %v", decode(t, granted[0]))
	}

	// Used up: the next call waits for a person.
	inForce, err := e.client.ListGrants(e.ctx, aaa.ListGrantsRequest{Tool: "wire_money"})
	if err != nil || len(inForce) != 0 {
		t.Fatalf("grants in force: %+v, %v", inForce, err)
	}
	all, err := e.client.ListGrants(e.ctx, aaa.ListGrantsRequest{IncludeRevoked: true})
	if err != nil || len(all) != 1 || all[0].ID != grant.ID {
		t.Fatalf("all grants: %+v, %v", all, err)
	}
	if used := all[0]; used.Active || used.Uses != 1 || used.UsesLeft == nil || *used.UsesLeft != 0 {
		t.Fatalf("used grant: %+v", used)
	}
	// Sent again with its request id (its answer lost): no second grant, the first as it is now.
	again, err := e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{
		Tool: "wire_money", Reason: "payroll day", Labels: labels, MaxUses: 1,
		RequestID: "grant-" + t.Name(),
	})
	if err != nil || again.ID != grant.ID || again.Uses != 1 {
		t.Fatalf("the retried grant: %+v, %v (want %s with 1 use)", again, err, grant.ID)
	}
	second := e.start(t, payACME(labels))
	e.requested(t, second, "")
	if _, err := e.client.Cancel(e.ctx, second, "done"); err != nil {
		t.Fatal(err)
	}

	revoked, err := e.client.RevokeGrant(e.ctx, grant.ID, "payroll is over")
	if err != nil {
		t.Fatal(err)
	}
	if revoked.RevokeReason != "payroll is over" || revoked.RevokedAt.IsZero() || revoked.Active {
		t.Fatalf("revoked grant: %+v", revoked)
	}
	_, err = e.client.RevokeGrant(e.ctx, "no-such-grant", "x")
	wantReason(t, err, aaa.ErrGrantNotFound)
}

func TestUnlimitedGrantListsUntilRevoked(t *testing.T) {
	e := setup(t)
	var ran atomic.Int32
	e.serve(t, aaa.WorkerOptions{Tools: []aaa.Tool{wireMoney(&ran)}})

	_, err := e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{Tool: "wire_money", Reason: "x", RunID: "no-such-run"})
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "scope.run_id" {
		t.Fatalf("field %q, want scope.run_id", got.Field())
	}
	grant, err := e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{Tool: "wire_money", Reason: "standing", StartedBy: "nobody"})
	if err != nil {
		t.Fatal(err)
	}
	if grant.UsesLeft != nil || grant.MaxUses != 0 || !grant.ExpiresAt.IsZero() || grant.StartedBy != "nobody" || !grant.Active {
		t.Fatalf("unlimited grant: %+v", grant)
	}
	listed, err := e.client.ListGrants(e.ctx, aaa.ListGrantsRequest{Tool: "wire_money"})
	if err != nil || len(listed) != 1 || listed[0].ID != grant.ID {
		t.Fatalf("grants in force: %+v, %v", listed, err)
	}
	if _, err := e.client.RevokeGrant(e.ctx, grant.ID, "over"); err != nil {
		t.Fatal(err)
	}
	if listed, err := e.client.ListGrants(e.ctx, aaa.ListGrantsRequest{Tool: "wire_money"}); err != nil || len(listed) != 0 {
		t.Fatalf("grants in force after revoking: %+v, %v", listed, err)
	}
	all, err := e.client.ListGrants(e.ctx, aaa.ListGrantsRequest{Tool: "wire_money", IncludeRevoked: true})
	if err != nil || len(all) != 1 || all[0].Active || all[0].RevokeReason != "over" {
		t.Fatalf("all grants: %+v, %v", all, err)
	}
	_, err = e.client.CreateGrant(e.ctx, aaa.CreateGrantRequest{Tool: "wire_money"})
	if got := wantReason(t, err, aaa.ErrInvalidField); got.Field() != "reason" {
		t.Fatalf("field %q, want reason", got.Field())
	}
}
