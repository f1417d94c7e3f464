-- What reviewers need (edits, N-of-M approvals, approver groups): a
-- pending approval also says how many distinct approvers its call needs,
-- the votes cast so far (a JSON array of {approver, time_ms, comment}),
-- for an edited call the call it replaces, and the approver groups that
-- may decide it (a JSON array of names; empty: any approver).
ALTER TABLE aaa_approvals
    ADD COLUMN approvals_required integer NOT NULL DEFAULT 1,
    ADD COLUMN votes jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN edited_from text NOT NULL DEFAULT '',
    ADD COLUMN approvers jsonb NOT NULL DEFAULT '[]';
