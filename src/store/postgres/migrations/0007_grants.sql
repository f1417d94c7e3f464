-- Standing grants: an approver's decision made in advance (see
-- docs/policy.md). The record is the prost-encoded GrantRecord; the tool
-- and times are columns for people reading the table. A use is a row of
-- its own, never a counter, so concurrent commits cannot lose a count:
-- a grant's uses are its rows in aaa_grant_uses.
CREATE TABLE aaa_grants (
    id text PRIMARY KEY,
    tool text NOT NULL,
    created_ms bigint NOT NULL,
    revoked_ms bigint NOT NULL DEFAULT 0,
    record bytea NOT NULL
);

CREATE TABLE aaa_grant_uses (
    grant_id text NOT NULL,
    run_id uuid NOT NULL,
    call_id text NOT NULL,
    PRIMARY KEY (grant_id, run_id, call_id)
);
