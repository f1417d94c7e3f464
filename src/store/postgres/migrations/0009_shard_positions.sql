-- The log partitioned by shard (docs/cluster.md): commits of disjoint
-- shards no longer take turns on one head row.
--
-- A commit takes a lock per shard it touches (a transaction-scoped
-- advisory lock, in shard order, so two commits never wait on each other
-- in a circle), then positions for its events from one sequence. Positions
-- stay unique; within a shard they rise in commit order, which is what
-- readers of the whole log rely on (one cursor position per shard). A
-- shard's head is its newest event's position. A claim of shards takes
-- the same locks, so a commit either lands before it or reads the new
-- epoch.

-- Every event's shard (its run id's last byte), for the readers that
-- follow one shard's positions, and for its head.
ALTER TABLE aaa_events ADD COLUMN shard smallint;
UPDATE aaa_events SET shard = get_byte(uuid_send(run_id), 15);
ALTER TABLE aaa_events ALTER COLUMN shard SET NOT NULL;
CREATE INDEX aaa_events_shard_position ON aaa_events (shard, position);

-- Positions go on from the old head, so every position given before this
-- version is below every one given after it: an old cursor (one global
-- position) still says exactly what its reader has read.
CREATE SEQUENCE aaa_positions AS bigint MINVALUE 1;
SELECT setval('aaa_positions', greatest(position, 1), position > 0) FROM aaa_head;
DROP TABLE aaa_head;

-- A consumer group's cursor, per shard (the encoded domain::Cursor); the
-- old column keeps the lowest of its positions, which every client that
-- read it may go on reading.
ALTER TABLE aaa_groups ADD COLUMN shard_cursor bytea;
