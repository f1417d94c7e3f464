-- The principal behind a worker actor (auth on), recorded beside the
-- identity the worker chose; empty for events written before.
ALTER TABLE aaa_events ADD COLUMN actor_principal text NOT NULL DEFAULT '';
