//! The Rust core of meshfast: config snapshots and the key index, shared-memory counters and
//! reservations, policy, and the JSON views. Everything here is plain Rust that `cargo test`
//! exercises without Python; `bindings` (feature `python`) is the only PyO3 module.

pub mod content;
pub mod dlp;
pub mod entry;
pub mod error;
pub mod exchange;
pub mod family;
pub mod govern;
pub mod http1;
pub mod ids;
pub mod json;
pub mod jwt;
pub mod keyindex;
pub mod outcome;
pub mod policy;
pub mod prepare;
pub mod pricing;
pub mod provider;
pub mod redact;
pub mod rules;
pub mod ruleset;
pub mod schema;
pub mod shm;
pub mod signals;
pub mod snapshot;
pub mod template;
pub mod translate;
pub mod views;
pub mod websearch;

#[cfg(feature = "python")]
mod bindings;

pub use error::{Error, Result};
