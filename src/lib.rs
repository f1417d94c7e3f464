//! aaa: a durable run server for AI agents with a server-enforced approval gate.
//!
//! The house in floors, from the edges down. A floor imports only the
//! floors beneath it; nothing below the edges imports `api`, `web` or `cli`.
//!
//! ```text
//! edges       api (tonic services: wire types <-> domain, validation, one
//!             error mapping), web (the approval inbox), cli (the aaa command),
//!             present (what web and cli show alike), http (plain HTTP beside
//!             gRPC), mcp (aaa as an MCP server at /mcp and a client of the
//!             upstream MCP servers of the --mcp file: each tools/call a
//!             call in a run), server (wiring: each part gets its own
//!             settings from Config), migrate; the bench lives in the
//!             executable only
//! components  cluster (shards, forwarding by routes declared in the proto),
//!             subscriptions (consumer groups, webhooks), openai (the built-in
//!             model: an in-process consumer of the engine's model tasks)
//! core        engine: state (the pure fold over typed events, one module per
//!             concern: model, tool, approval, run), driver (lock, cache,
//!             stage, fold, commit, act), runs, tasks (workers, tokens), timers,
//!             gate, grants, decisions, requests, retention
//!             store (a trait in domain terms, fenced writes; backends:
//!             embedded = sled + a segment log with group commit and fdatasync,
//!             postgres), policy (the policy file and its bounded CEL), auth
//!             (principals and roles; one layer in front of every service),
//!             providers (the --models file)
//! below       metrics, otel
//! ground      domain (ids, shards, records, the event catalogue decoded once,
//!             the token format, name checks, clipping), clock, seconds, causes
//! ```
//!
//! The durability contract: an RPC that appended events answers only after
//! the committer has written them, flushed sled and fsynced its data file.
//! Readers (StreamEvents, WatchApprovals) never see an event before that.
//! A run's state is a fold over its events, so after a crash the log is the
//! whole truth: indexes (pending approvals, timers, active runs) are written
//! in the same atomic batch as the events that imply them.

#![forbid(unsafe_code)]

pub mod api;
pub mod archive;
pub mod auth;
pub mod causes;
pub mod cli;
pub mod clock;
pub mod cluster;
pub mod config;
pub mod connections;
pub mod domain;
pub mod engine;
pub mod http;
pub mod https;
pub mod mcp;
pub mod metrics;
pub mod migrate;
pub mod openai;
pub mod otel;
pub mod policy;
pub mod present;
pub mod proto;
pub mod providers;
pub mod seconds;
pub mod server;
pub mod store;
pub mod subscriptions;
pub mod web;

pub use config::Config;
pub use server::{serve, ServeError};
