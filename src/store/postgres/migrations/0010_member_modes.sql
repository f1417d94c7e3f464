-- Whether each server shares the shards out with the others (the default
-- since spread shards became it) or takes part in one owner's cluster
-- (`--one-owner`, `--standby`, `--take-over`). The two must not be mixed
-- on one database: a server that would mix them is refused as it starts,
-- and a server that spreads counts only the others that spread when it
-- works out its share. Rows written before this column (servers of older
-- versions, which all ran with one owner unless told otherwise) read as
-- one owner's.
ALTER TABLE aaa_members ADD COLUMN spreads boolean NOT NULL DEFAULT false;
