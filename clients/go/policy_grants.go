// Policy and standing grants: GetPolicy, ReloadPolicy, CreateGrant,
// ListGrants and RevokeGrant.

package aaa

import (
	"context"
	"time"

	"aaa.dev/clients/go/aaav1"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// GetPolicy describes the approval policy the server runs with (Loaded is
// false without one). Each server of a cluster answers for its own file.
func (c *Client) GetPolicy(ctx context.Context) (Policy, error) {
	var resp *aaav1.GetPolicyResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.policies.GetPolicy(ctx, &aaav1.GetPolicyRequest{})
		return err
	})
	if err != nil {
		return Policy{}, err
	}
	return policyFromProto(resp), nil
}

// ReloadPolicy makes the server read its policy file again and returns the
// policy now in force. Role admin. A file that does not check fails with
// ErrInvalidField (the message names the rule) and the policy in force
// stays; so does a server started without --policy. Calls requested from now
// on follow the new policy; those already waiting keep what they were
// requested with.
func (c *Client) ReloadPolicy(ctx context.Context) (Policy, error) {
	var resp *aaav1.ReloadPolicyResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.policies.ReloadPolicy(ctx, &aaav1.ReloadPolicyRequest{})
		return err
	})
	if err != nil {
		return Policy{}, err
	}
	return policyFromProto(resp.GetPolicy()), nil
}

// GrantService returns the generated GrantService stub.
func (c *Client) GrantService() aaav1.GrantServiceClient { return c.grants }

// CreateGrantRequest describes a standing grant to create.
type CreateGrantRequest struct {
	// Tool is the tool whose calls it grants; it must be registered. Required.
	Tool string
	// Reason is why it exists, for the audit trail. Required.
	Reason string
	// RunID limits it to this run's calls.
	RunID string
	// Labels limits it to runs with every one of these labels, with these values.
	Labels map[string]string
	// StartedBy limits it to runs started by this principal.
	StartedBy string
	// Condition is a CEL expression over the call, with the variables of
	// policy rules (tool, args, labels, task, started_by, now); "": any call.
	Condition string
	// ArgumentsSHA256 limits it to calls with exactly these arguments (the
	// ArgumentsSHA256 of their Approval).
	ArgumentsSHA256 string
	// ExpiresAt is when it stops granting; zero (and ExpiresIn zero): never.
	ExpiresAt time.Time
	// ExpiresIn, when ExpiresAt is zero, is how long from now it grants.
	ExpiresIn time.Duration
	// MaxUses is how many calls it may grant; 0: any number.
	MaxUses uint64
	// RequestID is an idempotency key: a retry with the same id creates
	// nothing and returns the grant the first call created. Generated when
	// empty.
	RequestID string
}

// CreateGrant grants a tool's calls in advance (role approver): a gated call
// that would wait for one person and that the grant matches (tool, scope,
// condition, digest; not expired, revoked or used up) runs at once, with
// actor kind ActorGrant named after the grant's id. A policy rule's decision
// comes first; a call that needs several approvals still waits for them. Bad
// input fails with ErrInvalidField naming the field. Retried while the
// server is unavailable, with one request id, so a lost answer never makes a
// second grant.
func (c *Client) CreateGrant(ctx context.Context, r CreateGrantRequest) (Grant, error) {
	req := &aaav1.CreateGrantRequest{
		Tool:            r.Tool,
		Scope:           &aaav1.GrantScope{RunId: r.RunID, Labels: r.Labels, StartedBy: r.StartedBy},
		Condition:       r.Condition,
		ArgumentsSha256: r.ArgumentsSHA256,
		MaxUses:         r.MaxUses,
		Reason:          r.Reason,
		RequestId:       r.RequestID,
	}
	if req.RequestId == "" {
		req.RequestId = newID()
	}
	switch {
	case !r.ExpiresAt.IsZero():
		req.ExpiresAt = timestamppb.New(r.ExpiresAt)
	case r.ExpiresIn != 0:
		req.ExpiresAt = timestamppb.New(time.Now().Add(r.ExpiresIn))
	}
	var resp *aaav1.CreateGrantResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.grants.CreateGrant(ctx, req)
		return err
	})
	if err != nil {
		return Grant{}, err
	}
	return grantFromProto(resp.GetGrant()), nil
}

// ListGrantsRequest filters ListGrants.
type ListGrantsRequest struct {
	// IncludeRevoked also lists revoked, expired and used-up grants.
	IncludeRevoked bool
	// Tool lists only this tool's grants.
	Tool string
}

// ListGrants lists the grants in force, newest last, with their uses (with
// IncludeRevoked, also revoked, expired and used-up ones). Roles approver, reader.
func (c *Client) ListGrants(ctx context.Context, r ListGrantsRequest) ([]Grant, error) {
	var resp *aaav1.ListGrantsResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.grants.ListGrants(ctx, &aaav1.ListGrantsRequest{IncludeRevoked: r.IncludeRevoked, Tool: r.Tool})
		return err
	})
	if err != nil {
		return nil, err
	}
	grants := make([]Grant, 0, len(resp.GetGrants()))
	for _, g := range resp.GetGrants() {
		grants = append(grants, grantFromProto(g))
	}
	return grants, nil
}

// RevokeGrant revokes a grant: it grants nothing from now on (role
// approver). Revoking a revoked grant changes nothing. An unknown id fails
// with ErrGrantNotFound.
func (c *Client) RevokeGrant(ctx context.Context, id, reason string) (Grant, error) {
	var resp *aaav1.RevokeGrantResponse
	err := c.retry(ctx, func(ctx context.Context) (err error) {
		resp, err = c.grants.RevokeGrant(ctx, &aaav1.RevokeGrantRequest{Id: id, Reason: reason})
		return err
	})
	if err != nil {
		return Grant{}, err
	}
	return grantFromProto(resp.GetGrant()), nil
}
