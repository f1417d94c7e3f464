-- Tokens a run's model calls used (the built-in OpenAI-compatible model
-- reports them), kept in the run's summary for GetRun and ListRuns.
ALTER TABLE aaa_runs
    ADD COLUMN prompt_tokens bigint NOT NULL DEFAULT 0,
    ADD COLUMN completion_tokens bigint NOT NULL DEFAULT 0;
