-- The servers on this database: each one writes its row when it starts and
-- renews `seen_until_ms` while it runs, so every server knows where the
-- others answer (`address`, to forward calls to the owner of the runs) and
-- `aaa cluster status` can say who is alive. Rows of servers gone for a
-- while are pruned by the live ones.
CREATE TABLE aaa_members (
    server text PRIMARY KEY,
    address text NOT NULL,
    started_ms bigint NOT NULL,
    seen_until_ms bigint NOT NULL
);
