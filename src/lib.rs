//! aaa: a durable run server for AI agents with a server-enforced approval gate.
//!
//! ```text
//! http (plain HTTP beside gRPC on the same port: /metrics, the web inbox)
//!   -> web (the approval inbox's pages; they act through the gRPC API
//!           below as the signed-in person, over a loopback channel)
//! auth (one layer in front of every service: who is calling, may it?)
//! api (tonic services: wire types <-> domain, one error mapping)
//!   -> engine (per-run pure fold + driver: tool loop, approval gate,
//!              policy and standing grants, leases, durable timers,
//!              task dispatch)
//!     -> store (a trait in domain terms; backends: embedded = sled + a
//!               segment log with group commit and fdatasync, postgres)
//!   -> subscriptions (consumer groups: a dispatcher task per group follows
//!                     the durable global log; cursors and dead letters go
//!                     through the store's group commit)
//! openai (the built-in OpenAI-compatible model: an in-process consumer of
//!         the engine's model tasks, calling providers over HTTP)
//! engine::retention (a sweep that deletes finished runs past their
//!         retention, archives them first (archive), and asks the store to
//!         compact: the embedded log gives disk back a segment at a time)
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
