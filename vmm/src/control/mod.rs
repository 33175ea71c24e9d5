//! Changing and watching a running VM from outside: the HTTP/1.1 API on
//! the Unix socket of `hugevmm run --api-socket PATH`, the metrics-only
//! TCP listener of `--metrics-addr`, and the API's client (`hugevmm ctl`).
//! The API is written down in `docs/api.yaml`.
//!
//! - [`http`]: requests cut out of a connection's bytes, responses written.
//! - [`api`]: the routes, request bodies and their checks.
//! - [`context`]: carrying a request out against the VM.
//! - [`metrics`]: `GET /metrics` (Prometheus / OpenMetrics).
//! - [`server`]: the listeners and the threads that serve them.
//! - [`command`]: `hugevmm ctl`'s words and the request each stands for.
//! - [`client`]: `hugevmm ctl`.
//! - [`watch`]: `hugevmm ctl --watch` lines of rates.

pub(crate) mod api;
pub(crate) mod client;
pub(crate) mod command;
pub(crate) mod context;
pub mod http;
pub(crate) mod metrics;
pub(crate) mod server;
pub(crate) mod watch;

pub(crate) use context::ControlContext;
pub(crate) use server::{ControlSocket, MetricsListener, Routes};
