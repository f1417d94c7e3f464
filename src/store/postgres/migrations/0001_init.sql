-- aaa schema version 1. Every table is prefixed aaa_; ids are uuid columns,
-- unsigned numbers bigint (bit-cast), JSON text that must round-trip exactly
-- (event data, tool arguments, results) text, label maps jsonb (filtered
-- with @>). Columns compared in byte order (call ids, timer names) use the
-- "C" collation, as the embedded store orders its keys.

-- Which migrations this database has had.
CREATE TABLE aaa_schema (
    version integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);

-- Named values made once: the task-token key.
CREATE TABLE aaa_meta (
    name text PRIMARY KEY,
    value bytea NOT NULL
);

-- The one head row: the last global position given out. Every commit locks
-- it FOR UPDATE, which serialises writers (of every server on this database)
-- and keeps positions dense and in commit order.
CREATE TABLE aaa_head (
    id integer PRIMARY KEY CHECK (id = 1),
    position bigint NOT NULL
);
INSERT INTO aaa_head (id, position) VALUES (1, 0);

-- The global log. (run_id, seq) is unique: the last line of defence against
-- a forked history.
CREATE TABLE aaa_events (
    position bigint PRIMARY KEY,
    run_id uuid NOT NULL,
    seq bigint NOT NULL,
    id bytea NOT NULL,
    type text NOT NULL,
    data text NOT NULL,
    time_ms bigint NOT NULL,
    actor_kind integer NOT NULL,
    actor_name text NOT NULL,
    CONSTRAINT aaa_events_run_seq UNIQUE (run_id, seq)
);

-- Run summaries as written when their status changes; a run's head (last
-- seq, update time) is its newest event.
CREATE TABLE aaa_runs (
    run_id uuid PRIMARY KEY,
    status integer NOT NULL,
    task text NOT NULL,
    model text NOT NULL,
    tools jsonb NOT NULL,
    labels jsonb NOT NULL,
    created_ms bigint NOT NULL,
    updated_ms bigint NOT NULL,
    deadline_ms bigint NOT NULL,
    last_seq bigint NOT NULL,
    result_json text NOT NULL,
    error_type text NOT NULL,
    error_message text NOT NULL,
    started_by text NOT NULL
);
CREATE INDEX aaa_runs_status ON aaa_runs (status, run_id);
CREATE INDEX aaa_runs_labels ON aaa_runs USING gin (labels jsonb_path_ops);

-- Pending approvals.
CREATE TABLE aaa_approvals (
    run_id uuid NOT NULL,
    call_id text COLLATE "C" NOT NULL,
    tool text NOT NULL,
    arguments_json text NOT NULL,
    arguments_sha256 text NOT NULL,
    requested_ms bigint NOT NULL,
    expires_ms bigint NOT NULL,
    labels jsonb NOT NULL,
    seq bigint NOT NULL,
    task text NOT NULL,
    position bigint NOT NULL,
    PRIMARY KEY (run_id, call_id)
);
CREATE INDEX aaa_approvals_tool ON aaa_approvals (tool, run_id, call_id);

-- Runs with work to recover at startup.
CREATE TABLE aaa_active (
    run_id uuid PRIMARY KEY
);

-- Durable timers, earliest first.
CREATE TABLE aaa_timers (
    due_ms bigint NOT NULL,
    run_id uuid NOT NULL,
    name text COLLATE "C" NOT NULL,
    PRIMARY KEY (due_ms, run_id, name)
);

-- Registered tools' definitions (encoded by the engine).
CREATE TABLE aaa_tools (
    name text PRIMARY KEY,
    definition bytea NOT NULL
);

-- Answers to idempotent requests.
CREATE TABLE aaa_requests (
    scope bytea NOT NULL,
    request_id text NOT NULL,
    answer bytea NOT NULL,
    PRIMARY KEY (scope, request_id)
);

-- Consumer groups and their cursors.
CREATE TABLE aaa_groups (
    name text PRIMARY KEY,
    event_types jsonb NOT NULL,
    labels jsonb NOT NULL,
    ack_timeout_ms bigint NOT NULL,
    max_deliveries bigint NOT NULL,
    cursor bigint NOT NULL,
    created_ms bigint NOT NULL
);

-- Events a group gave up on.
CREATE TABLE aaa_dead_letters (
    group_name text NOT NULL,
    position bigint NOT NULL,
    run_id bytea NOT NULL,
    seq bigint NOT NULL,
    deliveries bigint NOT NULL,
    last_error text NOT NULL,
    dead_ms bigint NOT NULL,
    replaying boolean NOT NULL,
    PRIMARY KEY (group_name, position)
);
