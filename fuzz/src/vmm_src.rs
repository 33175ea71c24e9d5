//! vmm's image parsers and the API's HTTP framing, compiled here from vmm's own source files.
//!
//! vmm is a binary crate, and these files are pure code (bytes in, a
//! result out) whose only crate-level dependency is their sibling modules,
//! reproduced here with the same names. Including the files rather than
//! giving vmm a library target leaves vmm untouched and fuzzes exactly the
//! code it runs. Their `#[cfg(test)]` modules are not compiled here (this
//! lib has no unit-test build); they run in vmm.

// The fuzz targets use part of what these files define.
#![allow(dead_code)]

/// The API's HTTP framing (vmm/src/control/http.rs).
#[path = "../../vmm/src/control/http.rs"]
pub mod http;
#[path = "../../vmm/src/image_kind.rs"]
pub mod image_kind;
pub mod linux;
pub mod payload;
