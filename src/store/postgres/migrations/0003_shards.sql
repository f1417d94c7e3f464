-- Ownership of runs, by shard (a run's shard is its id's last byte). A
-- server that claims a shard bumps its epoch; every commit that touches a
-- run checks, in its transaction, that the run's shard still has the epoch
-- the committing server holds, so a server that lost a shard can never
-- write to its runs again. The owner renews its lease; a standby server
-- claims the shards once every lease has lapsed.
CREATE TABLE aaa_shards (
    shard smallint PRIMARY KEY CHECK (shard BETWEEN 0 AND 255),
    owner text NOT NULL DEFAULT '',
    epoch bigint NOT NULL DEFAULT 0,
    claimed_ms bigint NOT NULL DEFAULT 0,
    lease_until_ms bigint NOT NULL DEFAULT 0
);
INSERT INTO aaa_shards (shard) SELECT generate_series(0, 255);
