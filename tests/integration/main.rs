//! Integration tests of the aaa server over gRPC: one binary, one harness
//! (`support`), one module per theme.

mod support;

mod auth;
mod browser;
mod chaos;
mod cli;
mod cluster;
mod concurrency;
mod deadline;
mod errors;
mod failover;
mod fold;
mod fuzz;
mod gate;
mod grants;
mod hardening;
mod health;
mod hostile_cel;
mod leases;
mod mcp;
mod metrics;
mod migrate;
mod openai;
mod policy;
mod postgres;
mod prometheus;
mod restart;
mod retention;
mod retries;
mod reviews;
mod scenario;
mod storage;
mod stream;
mod subscriptions;
mod traces;
mod vectors;
mod watch;
mod web;
mod worker_auth;
