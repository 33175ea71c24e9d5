//! The 2 MiB swap engine: userfaultfd, fault service, eviction, stores.
#![deny(missing_docs)]

pub mod chunk;
mod counter_group;
pub mod engine;
pub mod index;
pub mod store;
pub mod uffd;
