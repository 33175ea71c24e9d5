//! The `--swap-store` value: which store to open, parsed from text.
//!
//! Forms:
//!
//! - `default[,reserve]`: an unlinked temporary file store in `$TMPDIR`
//!   (else `/var/tmp`), falling back as [`FileStore::temporary`] describes.
//!   It grows as units are written, up to the guest's RAM size.
//! - `file:PATH[,size=SIZE][,overwrite][,reserve][,keep]`: a new file
//!   (created, mode 0600; never an existing one) or, with `overwrite`, an
//!   existing file or block device whose content the store destroys. SIZE
//!   caps the store; it defaults to the guest's RAM size, and a SIZE below
//!   what the memory limit can need is refused at start
//!   ([`super::required_capacity_bytes`]). PATH cannot contain a comma.
//!   A new file's name is removed as soon as the store has it open and
//!   locked ([`FileStore::remove_created_name`]), so it never outlives the
//!   run, however the run ends; `keep` keeps it, for post-mortems, and then
//!   it holds guest memory after the run. An `overwrite` file is the
//!   user's and is never removed: it keeps what the run wrote (guest
//!   memory) after the run. [`StoreSpec::lifecycle_warning`] says so.
//! - `reserve` (with `default` and `file:`): allocate the whole capacity
//!   with `fallocate` at start, so that a filesystem without room says so
//!   before the guest runs instead of when the store fills.
//!
//! Every file store is locked (`flock`, exclusive) before anything is
//! written to it; see [`blockio::lockfile`].
//! - `nbd://HOST[:PORT]/EXPORT[,size=SIZE][,timeout=SECONDS]` and
//!   `nbd+unix:///EXPORT?socket=PATH[,size=SIZE][,timeout=SECONDS]`: the
//!   slots in an export of an NBD server ([`blockio::nbd`]), as the file
//!   store keeps them in a block device. The capacity is the export's
//!   size, or SIZE if smaller; an export smaller than the run can need is
//!   refused at start. `timeout=` bounds how long a dropped connection is
//!   retried (default 30 s) before the VM ends with the error. The URI
//!   cannot contain a comma unescaped (write `%2C`). Nothing is locked:
//!   keeping other clients off the export is the server's business.
//!   `nbds://` and `nbds+unix://` are the same over TLS (`NBD_OPT_STARTTLS`;
//!   the query's `tls-certificates=DIR`, `tls-hostname=NAME`, see
//!   [`blockio::nbd::NbdTls`]).
//! - `vhost-user-blk:PATH[,queues=N][,size=SIZE][,timeout=SECONDS]`: the
//!   slots in the block device a vhost-user-blk backend (qemu-storage-daemon,
//!   SPDK) serves on the Unix socket PATH ([`blockio::vhost_user_blk`]),
//!   as the file store keeps them. `queues=` request queues (default 1;
//!   the backend must have as many). The capacity is the device's, or
//!   SIZE if smaller, checked as for NBD. `timeout=` bounds how long a
//!   request may go unanswered and how long a lost backend is retried
//!   (default 30 s each) before the VM ends with the error. PATH cannot
//!   contain a comma.
//! - `mem:lz4[,size=SIZE]`, `mem:zstd[,size=SIZE]`: compressed memory. SIZE
//!   is the budget of compressed bytes; without it, only the slot count
//!   (guest RAM / unit) limits the store.
//! - `faulty:[KEY=N,...,]inner=SPEC` (for tests): [`FaultyStore`] around
//!   SPEC (default `mem:lz4`), KEY one of `read-error-after`,
//!   `corrupt-after`, `write-error-after`, `full-after` (lasting failures
//!   from the Nth operation on) or `transient-eio-every`,
//!   `transient-corrupt-every`, `delay-us` (failures the retry policy
//!   absorbs, and delays; [`Faults`] says what each does). `inner=` takes
//!   the rest of the value, so it comes last.
//!
//! Every store opened here is wrapped in a [`RetryingStore`] with the
//! default [`RetryPolicy`] (see [`super::retry`]).
//!
//! [`StoreSpec::open_with`] opens it sealed (`--swap-encrypt`): every kind
//! that keeps data takes the [`Integrity`] where it would take a checksum
//! (file stores on any [`blockio::BlockFile`] transport through
//! [`FileStore::set_integrity`], memory stores through
//! [`MemStore::set_integrity`]), and a store that comes out unsealed when
//! sealing was asked for is refused ([`StoreOpenError::CannotSeal`]), so a
//! new kind that forgets it cannot run in the clear by mistake.
//!
//! SIZE is a number of bytes with an optional `K`, `M`, `G` or `T` suffix
//! (powers of 1024; `KiB`/`KB` spellings accepted).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;

use super::codec::Codec;
use super::faulty::{Faults, FaultyStore};
use super::file::{FileOptions, FileStore, OldContent};
use super::mem::MemStore;
use super::retry::{RetryPolicy, RetryingStore};
use super::seal::Integrity;
use super::{CapacityNeed, SharedStore, StoreOpenError};
use blockio::nbd::{NbdOptions, NbdUri, NbdUriError, DEFAULT_RECONNECT_TIMEOUT};
use blockio::vhost_user_blk::VhostUserBlkOptions;
use blockio::{BlockFile, BlockOptions};
use std::time::Duration;

const VALID_FORMS: &str = "default[,reserve], file:PATH[,size=SIZE][,overwrite][,reserve][,keep], mem:lz4[,size=SIZE], mem:zstd[,size=SIZE], vhost-user-blk:PATH[,queues=N][,size=SIZE][,timeout=SECONDS], nbd://HOST[:PORT]/EXPORT[,size=SIZE][,timeout=SECONDS], nbd+unix:///EXPORT?socket=PATH[,size=SIZE][,timeout=SECONDS], and over TLS nbds://HOST[:PORT]/EXPORT[?tls-certificates=DIR][&tls-hostname=NAME][,...] or nbds+unix:///EXPORT?socket=PATH&tls-hostname=NAME[&tls-certificates=DIR][,...] (SIZE in bytes with an optional K, M, G or T suffix, e.g. 8G)";

/// A parsed `--swap-store` value; see the module docs for the forms.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub enum StoreSpec {
    /// The embedded temporary file store.
    #[default]
    Default,
    /// `default,reserve`: the temporary file store with its whole capacity
    /// allocated at start. (A variant of its own so that `Default` stays a
    /// plain value for the CLI's `unwrap_or(StoreSpec::Default)`.)
    DefaultReserved,
    /// A file or block device.
    File {
        /// Where.
        path: PathBuf,
        /// Cap on the store's size; `None`: the guest RAM size.
        size_bytes: Option<u64>,
        /// The path may exist (a file or block device) and its content be
        /// destroyed; without it only a new file is created.
        overwrite: bool,
        /// Allocate the whole capacity at start (`fallocate`).
        reserve: bool,
        /// Keep the name of a file the store creates after the run (for
        /// post-mortems); without it the name is removed at open.
        keep: bool,
    },
    /// Compressed memory.
    Mem {
        /// Compression.
        codec: Codec,
        /// Budget of compressed bytes; `None`: no byte limit.
        size_bytes: Option<u64>,
    },
    /// An NBD export.
    Nbd {
        /// The server and export.
        uri: NbdUri,
        /// Cap on the store's size; `None`: the guest RAM size (and never
        /// more than the export).
        size_bytes: Option<u64>,
        /// `timeout=`: seconds a dropped connection is retried; `None`:
        /// [`blockio::nbd::DEFAULT_RECONNECT_TIMEOUT`].
        timeout_secs: Option<u64>,
    },
    /// A vhost-user-blk backend's device.
    VhostUserBlk {
        /// The backend's Unix socket.
        path: PathBuf,
        /// Request queues; `None`: 1.
        queues: Option<u16>,
        /// Cap on the store's size; `None`: the guest RAM size (and never
        /// more than the device).
        size_bytes: Option<u64>,
        /// `timeout=`: seconds a request may go unanswered, and a lost
        /// backend is retried; `None`:
        /// [`blockio::vhost_user_blk::DEFAULT_TIMEOUT`].
        timeout_secs: Option<u64>,
    },
    /// A test aid: `inner` with failures injected.
    Faulty {
        /// What fails.
        faults: Faults,
        /// The store that does the work.
        inner: Box<StoreSpec>,
    },
}

/// A `--swap-store` value that does not parse.
#[derive(Debug, thiserror::Error)]
#[error("invalid swap store {spec:?}: {reason}; valid forms: {valid}")]
pub struct StoreSpecError {
    /// The text given.
    pub spec: String,
    /// What is wrong with it.
    pub reason: String,
    /// The forms that would parse.
    pub valid: &'static str,
}

/// A store opened by [`StoreSpec::open_for_run`].
pub struct OpenedStore {
    /// The store, under the default retry policy.
    pub store: SharedStore,
    /// An `,overwrite` file's old content, still to cut away before the
    /// first write: [`OldContent::cut`] on a thread that may truncate and
    /// `fchmod`; left alone, the store's first write does it.
    pub old_content: Option<OldContent>,
}

impl StoreSpec {
    /// Opens the store for units of `unit_bytes`, under the default retry
    /// policy. `default_capacity_bytes` (normally the guest RAM size)
    /// sizes a file store without `size=` and sets the slot count of a
    /// memory store.
    pub fn open(
        &self,
        unit_bytes: usize,
        default_capacity_bytes: u64,
    ) -> Result<SharedStore, StoreOpenError> {
        self.open_with(unit_bytes, default_capacity_bytes, &Integrity::Checksum)
    }

    /// [`StoreSpec::open`] with the images protected by `integrity`: a
    /// crc32 each, or sealed (`--swap-encrypt`).
    pub fn open_with(
        &self,
        unit_bytes: usize,
        default_capacity_bytes: u64,
        integrity: &Integrity,
    ) -> Result<SharedStore, StoreOpenError> {
        Ok(self
            .open_for_run(unit_bytes, default_capacity_bytes, integrity)?
            .store)
    }

    /// [`StoreSpec::open_with`], handing back an `,overwrite` file's old
    /// content for the caller to cut away where it chooses (see
    /// [`OpenedStore::old_content`]).
    pub fn open_for_run(
        &self,
        unit_bytes: usize,
        default_capacity_bytes: u64,
        integrity: &Integrity,
    ) -> Result<OpenedStore, StoreOpenError> {
        let (store, old_content) = self.open_bare(unit_bytes, default_capacity_bytes, integrity)?;
        if store.sealed() != integrity.is_sealed() {
            return Err(StoreOpenError::CannotSeal {
                store: store.describe(),
            });
        }
        Ok(OpenedStore {
            store: Arc::new(RetryingStore::new(store, RetryPolicy::default())),
            old_content,
        })
    }

    /// [`StoreSpec::open_with`] without the retry policy, which wraps the
    /// whole store once (a `faulty:` store's faults are then retried too).
    fn open_bare(
        &self,
        unit_bytes: usize,
        default_capacity_bytes: u64,
        integrity: &Integrity,
    ) -> Result<(SharedStore, Option<OldContent>), StoreOpenError> {
        let mut old_content = None;
        let store: SharedStore = match self {
            StoreSpec::Default | StoreSpec::DefaultReserved => {
                let dir = std::env::var_os("TMPDIR")
                    .filter(|d| !d.is_empty())
                    .map_or_else(|| PathBuf::from("/var/tmp"), PathBuf::from);
                let mut store = FileStore::temporary(&dir, unit_bytes, default_capacity_bytes)?;
                if *self == StoreSpec::DefaultReserved {
                    store.reserve_capacity()?;
                }
                store.set_integrity(integrity.clone());
                Arc::new(store)
            }
            StoreSpec::File {
                path,
                size_bytes,
                overwrite,
                reserve,
                keep,
            } => {
                let mut store = FileStore::create_with(
                    path,
                    unit_bytes,
                    size_bytes.unwrap_or(default_capacity_bytes),
                    FileOptions {
                        overwrite: *overwrite,
                    },
                    &BlockOptions::default(),
                )?;
                if !*keep {
                    store.remove_created_name()?;
                }
                if *reserve {
                    if let Err(e) = store.reserve_capacity() {
                        // A store that fails to open leaves no file, kept
                        // or not: there is nothing in it to look at.
                        let _ = store.remove_created_name();
                        return Err(e);
                    }
                }
                store.set_integrity(integrity.clone());
                let store = Arc::new(store);
                old_content = OldContent::of(&store);
                store
            }
            StoreSpec::Mem { codec, size_bytes } => {
                let slots = (default_capacity_bytes / unit_bytes.max(1) as u64).max(1);
                let mut store = MemStore::new(*codec, unit_bytes, slots, *size_bytes)?;
                store.set_integrity(integrity.clone());
                Arc::new(store)
            }
            StoreSpec::Nbd {
                uri,
                size_bytes,
                timeout_secs,
            } => {
                let opts = NbdOptions {
                    reconnect_timeout: timeout_secs
                        .map_or(DEFAULT_RECONNECT_TIMEOUT, Duration::from_secs),
                    read_only: false,
                };
                let block = BlockFile::open_nbd(uri, &opts)?;
                let export = *block.nbd().expect("an NBD block file").export();
                let description = format!(
                    "{uri} (NBD export of {} bytes; writes durable by {})",
                    export.size_bytes,
                    if export.can_fua() {
                        "FUA"
                    } else if export.can_flush() {
                        "flush"
                    } else {
                        "the server's acknowledgement (it offers neither FUA nor flush)"
                    }
                );
                remote_block_store(
                    block,
                    unit_bytes,
                    size_bytes.unwrap_or(default_capacity_bytes),
                    description,
                    integrity,
                )?
            }
            StoreSpec::VhostUserBlk {
                path,
                queues,
                size_bytes,
                timeout_secs,
            } => {
                let defaults = VhostUserBlkOptions::default();
                let opts = VhostUserBlkOptions {
                    queues: queues.unwrap_or(defaults.queues),
                    timeout: timeout_secs.map_or(defaults.timeout, Duration::from_secs),
                    ..defaults
                };
                let block = BlockFile::open_vhost_user_blk(path, &opts)?;
                let client = block.vhost_user_blk().expect("a vhost-user-blk block file");
                let description = format!(
                    "vhost-user-blk:{} ({} bytes in blocks of {}, {} queue{}, buffers shared in {} pages)",
                    path.display(),
                    client.capacity_bytes(),
                    block.offset_align_bytes(),
                    opts.queues,
                    if opts.queues == 1 { "" } else { "s" },
                    if client.small_pages_why().is_none() {
                        "2 MiB"
                    } else {
                        "4 KiB"
                    }
                );
                remote_block_store(
                    block,
                    unit_bytes,
                    size_bytes.unwrap_or(default_capacity_bytes),
                    description,
                    integrity,
                )?
            }
            StoreSpec::Faulty { faults, inner } => {
                let (store, old) =
                    inner.open_bare(unit_bytes, default_capacity_bytes, integrity)?;
                old_content = old;
                Arc::new(FaultyStore::new(store, *faults))
            }
        };
        Ok((store, old_content))
    }

    /// What the user must know about a `file:` store that outlives the run
    /// (`,keep`, `,overwrite`): that it holds guest memory afterwards, in
    /// the clear unless `sealed` (`--swap-encrypt`). None for every other
    /// store, which keeps nothing after the run.
    pub fn lifecycle_warning(&self, sealed: bool) -> Option<String> {
        let memory = if sealed {
            "sealed guest memory (--swap-encrypt: unreadable once this run's key is gone)"
        } else {
            "guest memory in the clear (add --swap-encrypt to seal it)"
        };
        match self {
            StoreSpec::File {
                path,
                overwrite: true,
                ..
            } => Some(format!(
                "--swap-store {self}: {} was there before the run, so it is not removed: its old content is destroyed (a regular file is emptied and made mode 0600 before the guest starts, a block device is overwritten as the store fills), and after the run it keeps what the store wrote, {memory}; remove or wipe it when done",
                path.display()
            )),
            StoreSpec::File {
                path, keep: true, ..
            } => Some(format!(
                "--swap-store {self}: {} stays after the run (,keep) and holds {memory}; remove it when done (a run on the same path needs it gone, or ,overwrite)",
                path.display()
            )),
            StoreSpec::Faulty { inner, .. } => inner.lifecycle_warning(sealed),
            _ => None,
        }
    }
}

impl StoreSpec {
    /// Refuses, before anything is opened, a store whose size the user gave
    /// (`size=`) below `need` (see [`super::required_capacity_bytes`]).
    /// Memory stores are not checked: their `size=` counts compressed
    /// bytes, so it says nothing about how many units fit.
    pub fn check_size(&self, need: &CapacityNeed) -> Result<(), StoreOpenError> {
        match self {
            StoreSpec::File {
                size_bytes: Some(size_bytes),
                ..
            }
            | StoreSpec::Nbd {
                size_bytes: Some(size_bytes),
                ..
            }
            | StoreSpec::VhostUserBlk {
                size_bytes: Some(size_bytes),
                ..
            } => need.check(&format!("size={size_bytes}"), *size_bytes),
            StoreSpec::Faulty { inner, .. } => inner.check_size(need),
            _ => Ok(()),
        }
    }
}

impl FromStr for StoreSpec {
    type Err = StoreSpecError;

    fn from_str(s: &str) -> Result<Self, StoreSpecError> {
        let fail = |reason: String| StoreSpecError {
            spec: s.to_string(),
            reason,
            valid: VALID_FORMS,
        };
        let (kind, rest) = s.split_once(':').unwrap_or((s, ""));
        match kind {
            "default" if !s.contains(':') => Ok(StoreSpec::Default),
            "default,reserve" if !s.contains(':') => Ok(StoreSpec::DefaultReserved),
            "default" => Err(fail("default takes no options but ,reserve".into())),
            k if k.starts_with("default,") => Err(fail(format!(
                "unknown option {:?} of default, the only one is reserve",
                &k["default,".len()..]
            ))),
            "file" => {
                let mut parts = rest.split(',');
                let path = parts.next().unwrap_or("");
                if path.is_empty() {
                    return Err(fail("file: needs a path".into()));
                }
                let (size_bytes, flags) =
                    parse_options(parts, &["overwrite", "reserve", "keep"]).map_err(fail)?;
                Ok(StoreSpec::File {
                    path: PathBuf::from(path),
                    size_bytes,
                    overwrite: flags.contains(&"overwrite"),
                    reserve: flags.contains(&"reserve"),
                    keep: flags.contains(&"keep"),
                })
            }
            "mem" => {
                let mut parts = rest.split(',');
                let codec = match parts.next().unwrap_or("") {
                    "lz4" => Codec::Lz4,
                    "zstd" => Codec::Zstd,
                    other => return Err(fail(format!("unknown codec {other:?}, use lz4 or zstd"))),
                };
                let (size_bytes, _) = parse_options(parts, &[]).map_err(fail)?;
                Ok(StoreSpec::Mem { codec, size_bytes })
            }
            "vhost-user-blk" => parse_vhost_user_blk(rest).map_err(fail),
            _ if NbdUri::looks_like(s) => parse_nbd(s),
            "faulty" => parse_faulty(rest).map_err(|reason| {
                fail(format!(
                    "{reason} (test form: faulty:[read-error-after=N,][corrupt-after=N,][write-error-after=N,][full-after=N,][transient-eio-every=N,][transient-corrupt-every=N,][delay-us=N,]inner=SPEC)"
                ))
            }),
            _ => Err(fail(format!("unknown store kind {kind:?}"))),
        }
    }
}

/// The option list of `file:` and `mem:`: `size=SIZE` and the bare
/// `flags` this kind takes. Returns the size and the flags given.
/// A file store on a block device reached through a client (an NBD
/// export, a vhost-user-blk backend), sealed with `integrity`.
fn remote_block_store(
    block: BlockFile,
    unit_bytes: usize,
    capacity_bytes: u64,
    description: String,
    integrity: &Integrity,
) -> Result<SharedStore, StoreOpenError> {
    let mut store = FileStore::from_block(block, unit_bytes, capacity_bytes, description)?;
    store.set_integrity(integrity.clone());
    Ok(Arc::new(store))
}

fn parse_options<'a>(
    parts: impl Iterator<Item = &'a str>,
    flags: &[&'static str],
) -> Result<(Option<u64>, Vec<&'static str>), String> {
    let mut size = None;
    let mut given = Vec::new();
    for part in parts {
        if let Some(flag) = flags.iter().find(|f| **f == part) {
            given.push(*flag);
            continue;
        }
        match part.split_once('=') {
            Some(("size", value)) => size = Some(parse_size(value)?),
            _ => {
                let mut known = vec!["size=SIZE"];
                known.extend_from_slice(flags);
                return Err(format!(
                    "unknown option {part:?}, the options are {}",
                    known.join(", ")
                ));
            }
        }
    }
    Ok((size, given))
}

/// `URI[,size=SIZE][,timeout=SECONDS]`.
fn parse_nbd(text: &str) -> Result<StoreSpec, StoreSpecError> {
    let fail = |reason: String| StoreSpecError {
        spec: text.to_string(),
        reason,
        valid: VALID_FORMS,
    };
    let mut parts = text.split(',');
    let uri: NbdUri = parts
        .next()
        .unwrap_or("")
        .parse()
        .map_err(|e: NbdUriError| fail(e.to_string()))?;
    let mut size_bytes = None;
    let mut timeout_secs = None;
    for part in parts {
        match part.split_once('=') {
            Some(("size", value)) => size_bytes = Some(parse_size(value).map_err(fail)?),
            Some(("timeout", value)) => timeout_secs = Some(parse_timeout(value).map_err(fail)?),
            _ => {
                return Err(fail(format!(
                    "unknown option {part:?} of an NBD store, the options are size=SIZE and timeout=SECONDS (a comma inside the URI is written %2C)"
                )))
            }
        }
    }
    Ok(StoreSpec::Nbd {
        uri,
        size_bytes,
        timeout_secs,
    })
}

/// `timeout=SECONDS`: whole seconds from 1 to a day.
fn parse_timeout(value: &str) -> Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|&s| s > 0 && s <= 86_400)
        .ok_or_else(|| format!("timeout= takes whole seconds from 1 to 86400, got {value:?}"))
}

/// `PATH[,queues=N][,size=SIZE][,timeout=SECONDS]` after `vhost-user-blk:`.
fn parse_vhost_user_blk(rest: &str) -> Result<StoreSpec, String> {
    let mut parts = rest.split(',');
    let path = parts.next().unwrap_or("");
    if path.is_empty() {
        return Err("vhost-user-blk: needs the backend's socket path".into());
    }
    let mut spec_queues = None;
    let mut size_bytes = None;
    let mut timeout_secs = None;
    for part in parts {
        match part.split_once('=') {
            Some(("queues", value)) => {
                let n = value.parse::<u16>().ok().filter(|&n| (1..=64).contains(&n));
                spec_queues = Some(n.ok_or_else(|| {
                    format!("queues= takes a count from 1 to 64, got {value:?}")
                })?);
            }
            Some(("size", value)) => size_bytes = Some(parse_size(value)?),
            Some(("timeout", value)) => timeout_secs = Some(parse_timeout(value)?),
            _ => {
                return Err(format!(
                    "unknown option {part:?} of a vhost-user-blk store, the options are queues=N, size=SIZE and timeout=SECONDS"
                ))
            }
        }
    }
    Ok(StoreSpec::VhostUserBlk {
        path: PathBuf::from(path),
        queues: spec_queues,
        size_bytes,
        timeout_secs,
    })
}

fn parse_faulty(rest: &str) -> Result<StoreSpec, String> {
    let mut faults = Faults::default();
    let mut inner = "mem:lz4";
    let mut remaining = rest;
    while !remaining.is_empty() {
        if let Some(spec) = remaining.strip_prefix("inner=") {
            inner = spec;
            break;
        }
        let (part, tail) = remaining.split_once(',').unwrap_or((remaining, ""));
        remaining = tail;
        let (key, value) = part
            .split_once('=')
            .ok_or_else(|| format!("expected KEY=N, got {part:?}"))?;
        let n: u64 = value
            .parse()
            .map_err(|_| format!("{key} needs a whole number, got {value:?}"))?;
        let field = match key {
            "read-error-after" => &mut faults.read_error_after,
            "corrupt-after" => &mut faults.corrupt_after,
            "write-error-after" => &mut faults.write_error_after,
            "full-after" => &mut faults.full_after_slots,
            "transient-eio-every" => &mut faults.transient_eio_every,
            "transient-corrupt-every" => &mut faults.transient_corrupt_every,
            "delay-us" => &mut faults.delay_us,
            _ => return Err(format!("unknown fault {key:?}")),
        };
        if key.ends_with("-every") && n == 0 {
            return Err(format!("{key} needs a count of 1 or more, got 0"));
        }
        *field = Some(n);
    }
    let inner: StoreSpec = inner
        .parse()
        .map_err(|e: StoreSpecError| format!("inner store: {}", e.reason))?;
    Ok(StoreSpec::Faulty {
        faults,
        inner: Box::new(inner),
    })
}

/// Bytes from `512`, `64K`, `8G`, `1GiB`, ... (powers of 1024).
fn parse_size(text: &str) -> Result<u64, String> {
    let bad = || format!("bad size {text:?}, expected e.g. 512M or 8G");
    let split = text
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(text.len());
    let (digits, suffix) = text.split_at(split);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let shift = match suffix.to_ascii_uppercase().as_str() {
        "" | "B" => 0,
        "K" | "KB" | "KIB" => 10,
        "M" | "MB" | "MIB" => 20,
        "G" | "GB" | "GIB" => 30,
        "T" | "TB" | "TIB" => 40,
        _ => return Err(bad()),
    };
    n.checked_mul(1u64 << shift).ok_or_else(bad)
}

impl fmt::Display for StoreSpec {
    /// Prints the spec in the form it parses from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let size = |f: &mut fmt::Formatter<'_>, size_bytes: &Option<u64>| match size_bytes {
            Some(b) => write!(f, ",size={b}"),
            None => Ok(()),
        };
        match self {
            StoreSpec::Default => f.write_str("default"),
            StoreSpec::DefaultReserved => f.write_str("default,reserve"),
            StoreSpec::File {
                path,
                size_bytes,
                overwrite,
                reserve,
                keep,
            } => {
                write!(f, "file:{}", path.display())?;
                size(f, size_bytes)?;
                if *overwrite {
                    f.write_str(",overwrite")?;
                }
                if *reserve {
                    f.write_str(",reserve")?;
                }
                if *keep {
                    f.write_str(",keep")?;
                }
                Ok(())
            }
            StoreSpec::Mem { codec, size_bytes } => {
                write!(f, "mem:{codec}")?;
                size(f, size_bytes)
            }
            StoreSpec::Nbd {
                uri,
                size_bytes,
                timeout_secs,
            } => {
                write!(f, "{uri}")?;
                size(f, size_bytes)?;
                if let Some(secs) = timeout_secs {
                    write!(f, ",timeout={secs}")?;
                }
                Ok(())
            }
            StoreSpec::VhostUserBlk {
                path,
                queues,
                size_bytes,
                timeout_secs,
            } => {
                write!(f, "vhost-user-blk:{}", path.display())?;
                if let Some(n) = queues {
                    write!(f, ",queues={n}")?;
                }
                size(f, size_bytes)?;
                if let Some(secs) = timeout_secs {
                    write!(f, ",timeout={secs}")?;
                }
                Ok(())
            }
            StoreSpec::Faulty { faults, inner } => {
                f.write_str("faulty:")?;
                for (key, value) in faults.by_key() {
                    if let Some(n) = value {
                        write!(f, "{key}={n},")?;
                    }
                }
                write!(f, "inner={inner}")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::StoreKey;
    use crate::store::test_support::unit_image;
    use crate::store::{StoreError, WriteRequest};
    use blockio::AlignedBuf;

    fn parse(s: &str) -> StoreSpec {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn valid_forms() {
        assert_eq!(parse("default"), StoreSpec::Default);
        assert_eq!(
            parse("file:/var/tmp/swap.img"),
            StoreSpec::File {
                path: "/var/tmp/swap.img".into(),
                size_bytes: None,
                overwrite: false,
                reserve: false,
                keep: false,
            }
        );
        assert_eq!(
            parse("file:/dev/vdb,size=8G"),
            StoreSpec::File {
                path: "/dev/vdb".into(),
                size_bytes: Some(8 << 30),
                overwrite: false,
                reserve: false,
                keep: false,
            }
        );
        assert_eq!(
            parse("file:/dev/vdb,overwrite,size=8G"),
            StoreSpec::File {
                path: "/dev/vdb".into(),
                size_bytes: Some(8 << 30),
                overwrite: true,
                reserve: false,
                keep: false,
            }
        );
        assert_eq!(
            parse("file:/x,reserve"),
            StoreSpec::File {
                path: "/x".into(),
                size_bytes: None,
                overwrite: false,
                reserve: true,
                keep: false,
            }
        );
        assert_eq!(
            parse("file:/x,keep,overwrite"),
            StoreSpec::File {
                path: "/x".into(),
                size_bytes: None,
                overwrite: true,
                reserve: false,
                keep: true,
            }
        );
        assert_eq!(parse("default,reserve"), StoreSpec::DefaultReserved);
        assert_eq!(
            parse("mem:lz4"),
            StoreSpec::Mem {
                codec: Codec::Lz4,
                size_bytes: None
            }
        );
        assert_eq!(
            parse("mem:zstd,size=512M"),
            StoreSpec::Mem {
                codec: Codec::Zstd,
                size_bytes: Some(512 << 20)
            }
        );
        assert_eq!(
            parse("faulty:read-error-after=3,inner=mem:zstd,size=1G"),
            StoreSpec::Faulty {
                faults: Faults {
                    read_error_after: Some(3),
                    ..Faults::default()
                },
                inner: Box::new(StoreSpec::Mem {
                    codec: Codec::Zstd,
                    size_bytes: Some(1 << 30)
                })
            }
        );
        assert_eq!(
            parse("faulty:corrupt-after=0,write-error-after=1,full-after=2"),
            StoreSpec::Faulty {
                faults: Faults {
                    corrupt_after: Some(0),
                    write_error_after: Some(1),
                    full_after_slots: Some(2),
                    ..Faults::default()
                },
                inner: Box::new(StoreSpec::Mem {
                    codec: Codec::Lz4,
                    size_bytes: None
                })
            }
        );
    }

    #[test]
    fn nbd_forms_parse_and_print_back() {
        let spec = parse("nbd://127.0.0.1/swap");
        assert_eq!(
            spec,
            StoreSpec::Nbd {
                uri: "nbd://127.0.0.1/swap".parse().unwrap(),
                size_bytes: None,
                timeout_secs: None,
            }
        );
        for text in [
            "nbd://127.0.0.1/swap",
            "nbd://storage:10900/vol,size=8G,timeout=120",
            "nbd+unix:///swap?socket=/run/nbd.sock,timeout=5",
            "nbd://h/a%2Cb",
            "nbds://h/x?tls-certificates=/etc/pki/nbd,timeout=5",
            "nbds+unix:///x?socket=/s&tls-hostname=localhost",
            "faulty:transient-eio-every=3,inner=nbd://h/x,size=1G",
        ] {
            let spec = parse(text);
            assert_eq!(parse(&spec.to_string()), spec, "{text}");
        }
        assert_eq!(
            parse("nbd://h:10900/vol,size=8G,timeout=120").to_string(),
            "nbd://h:10900/vol,size=8589934592,timeout=120"
        );
    }

    #[test]
    fn vhost_user_blk_forms_parse_and_print_back() {
        assert_eq!(
            parse("vhost-user-blk:/run/qsd.sock"),
            StoreSpec::VhostUserBlk {
                path: "/run/qsd.sock".into(),
                queues: None,
                size_bytes: None,
                timeout_secs: None,
            }
        );
        for text in [
            "vhost-user-blk:/run/qsd.sock",
            "vhost-user-blk:/run/qsd.sock,queues=4,size=8589934592,timeout=5",
            "faulty:transient-eio-every=3,inner=vhost-user-blk:/s,queues=2",
        ] {
            let spec = parse(text);
            assert_eq!(parse(&spec.to_string()), spec, "{text}");
        }
        for (bad, why) in [
            ("vhost-user-blk:", "socket path"),
            (
                "vhost-user-blk:/s,queues=0",
                "queues= takes a count from 1 to 64",
            ),
            ("vhost-user-blk:/s,queues=x", "queues= takes"),
            (
                "vhost-user-blk:/s,timeout=0",
                "timeout= takes whole seconds",
            ),
            ("vhost-user-blk:/s,size=1Q", "size"),
            (
                "vhost-user-blk:/s,fast",
                "the options are queues=N, size=SIZE",
            ),
        ] {
            let err = bad.parse::<StoreSpec>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
        }
    }

    #[test]
    fn bad_nbd_stores_say_what_is_expected() {
        for (bad, why) in [
            ("nbd:///swap", "needs a host"),
            ("nbd+unix:///swap", "socket=PATH"),
            ("nbd://h/x,timeout=0", "whole seconds from 1"),
            ("nbd://h/x,timeout=soon", "whole seconds from 1"),
            ("nbd://h/x,size=lots", "bad size"),
            (
                "nbd://h/x,overwrite",
                "the options are size=SIZE and timeout=SECONDS",
            ),
            ("nbds://h/x?tls-psk-file=/k", "pre-shared key"),
        ] {
            let err = bad.parse::<StoreSpec>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad}: {err}");
            assert!(
                err.contains("nbd+unix:///EXPORT?socket=PATH"),
                "{bad}: {err}"
            );
        }
    }

    #[test]
    fn an_nbd_store_keeps_units_on_the_server() {
        let Some(server) =
            blockio::test_support::NbdServer::nbdkit("nbd store", &["memory", "size=16M"])
        else {
            return;
        };
        // Asked for more than the export holds: the export's size wins.
        let store = parse(server.uri()).open(2 << 20, 64 << 20).unwrap();
        assert_eq!(store.capacity_slots(), 8);
        assert!(store.describe().contains("NBD export of 16777216 bytes"));
        assert!(store.describe().contains("durable by FUA"));
        let imgs: Vec<_> = (0..8).map(|i| unit_image(i, 2 << 20)).collect();
        let requests: Vec<WriteRequest> = imgs
            .iter()
            .enumerate()
            .map(|(i, img)| WriteRequest {
                gpa: StoreKey::new((i as u64) << 21),
                data: img,
            })
            .collect();
        let slots: Vec<_> = store
            .write_batch(&requests)
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        let mut buf = AlignedBuf::new(2 << 20, 4096);
        for (slot, img) in slots.iter().zip(&imgs) {
            store.read(*slot, StoreKey::new(0), &mut buf).unwrap();
            assert!(buf[..] == img[..]);
        }
        let full = store.write_batch(&requests[..1]).pop().unwrap();
        assert!(matches!(full, Err(StoreError::Full { .. })), "{full:?}");
    }

    #[test]
    fn transient_faults_parse() {
        assert_eq!(
            parse("faulty:transient-eio-every=50,transient-corrupt-every=9,delay-us=200,inner=mem:zstd"),
            StoreSpec::Faulty {
                faults: Faults {
                    transient_eio_every: Some(50),
                    transient_corrupt_every: Some(9),
                    delay_us: Some(200),
                    ..Faults::default()
                },
                inner: Box::new(StoreSpec::Mem {
                    codec: Codec::Zstd,
                    size_bytes: None
                })
            }
        );
    }

    #[test]
    fn opened_stores_retry_a_transient_eio() {
        let store = parse("faulty:transient-eio-every=1,inner=mem:lz4")
            .open(2 << 20, 8 << 20)
            .unwrap();
        assert_eq!(
            store.describe(),
            "faulty:transient-eio-every=1,inner=mem:lz4"
        );
        let img = unit_image(3, 2 << 20);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0x40_0000),
            data: &img,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let mut buf = AlignedBuf::new(2 << 20, 4096);
        store
            .read(slot, StoreKey::new(0x40_0000), &mut buf)
            .unwrap();
        assert!(buf[..] == img[..]);
        let report = store.report();
        assert_eq!(report.injected.transient_errors, 2, "{report:?}");
        assert_eq!(report.retry.recovered, 2, "{report:?}");
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "default",
            "file:/var/tmp/x,size=1073741824",
            "file:/var/tmp/x,size=1073741824,overwrite,reserve",
            "file:/dev/sdz,overwrite",
            "file:/var/tmp/x,reserve",
            "file:/var/tmp/x,size=4096,overwrite,reserve,keep",
            "file:/var/tmp/x,keep",
            "default,reserve",
            "mem:lz4",
            "mem:zstd,size=4096",
            "faulty:read-error-after=3,full-after=9,inner=file:/var/tmp/y",
            "faulty:transient-eio-every=7,transient-corrupt-every=5,delay-us=300,inner=default",
        ] {
            assert_eq!(parse(s).to_string(), s);
        }
    }

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(64 << 10));
        assert_eq!(parse_size("3m"), Ok(3 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1T"), Ok(1 << 40));
        for bad in ["", "G", "1.5G", "12X", "-1", "99999999999T"] {
            assert!(parse_size(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn errors_name_the_valid_forms() {
        for (bad, why) in [
            ("", "unknown store kind"),
            ("disk:/x", "unknown store kind"),
            ("default:x", "takes no options"),
            ("default,overwrite", "only one is reserve"),
            ("mem:lz4,reserve", "unknown option"),
            ("file:/x,overwrite=yes", "unknown option"),
            ("file:", "needs a path"),
            ("file:/x,size=", "bad size"),
            ("file:/x,sz=1G", "unknown option"),
            ("mem:lz5", "unknown codec"),
            ("mem:lz4,size=lots", "bad size"),
            ("faulty:read-error-after=x", "whole number"),
            ("faulty:explode=1", "unknown fault"),
            ("faulty:transient-eio-every=0", "1 or more"),
            ("faulty:inner=mem:none", "inner store"),
        ] {
            let err = bad.parse::<StoreSpec>().unwrap_err().to_string();
            assert!(err.contains(why), "{bad:?}: {err}");
            assert!(
                err.contains("file:PATH[,size=SIZE][,overwrite][,reserve][,keep], mem:lz4"),
                "{bad:?}: {err}"
            );
        }
    }

    #[test]
    fn open_each_kind() {
        let unit = 2 << 20;
        let guest = 64 << 20;
        let mem = parse("mem:zstd,size=8M").open(unit, guest).unwrap();
        assert_eq!(mem.capacity_slots(), 32);
        assert!(mem.describe().starts_with("mem:zstd"));
        let default = parse("default").open(unit, guest).unwrap();
        assert_eq!(default.capacity_slots(), 32);
        assert!(
            default.describe().starts_with("file:"),
            "{}",
            default.describe()
        );
        let dir = blockio::test_support::test_dir();
        let path = dir.join(format!(".spec-open-{}", std::process::id()));
        let file = parse(&format!("file:{},size=8M", path.display()))
            .open(unit, guest)
            .unwrap();
        assert!(!path.exists(), "the store's name is removed at open");
        assert_eq!(file.capacity_slots(), 4);
        let Err(err) = parse(&format!("file:{},size=1M", path.display())).open(unit, guest) else {
            panic!("a 1 MiB file store of 2 MiB units must not open");
        };
        let _ = std::fs::remove_file(&path);
        assert!(matches!(err, StoreOpenError::TooSmall { .. }), "{err}");
    }

    fn written_and_read_back(store: &SharedStore) {
        let img = unit_image(7, store.unit_bytes());
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0),
            data: &img,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let mut buf = AlignedBuf::new(store.unit_bytes(), 4096);
        store.read(slot, StoreKey::new(0), &mut buf).unwrap();
        assert!(buf[..] == img[..]);
    }

    /// A new file's name is gone as soon as the store is open (nothing is
    /// left after the run, however it ends), while the store works on; with
    /// `,keep` it stays, written, after the store is gone.
    #[test]
    fn a_new_file_is_unnamed_at_open_unless_kept() {
        let dir = blockio::test_support::test_dir();
        let path = dir.join(format!(".spec-lifecycle-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let spec = parse(&format!("file:{}", path.display()));
        assert_eq!(spec.lifecycle_warning(false), None);
        let store = spec.open(2 << 20, 8 << 20).unwrap();
        assert!(!path.exists(), "{} still there", path.display());
        assert!(
            store.describe().contains("name removed at start"),
            "{}",
            store.describe()
        );
        written_and_read_back(&store);
        drop(store);
        // The same command again: nothing in the way.
        let again = spec.open(2 << 20, 8 << 20).unwrap();
        assert!(!path.exists());
        drop(again);

        let kept = parse(&format!("file:{},keep", path.display()));
        let store = kept.open(2 << 20, 8 << 20).unwrap();
        written_and_read_back(&store);
        drop(store);
        let len = std::fs::metadata(&path).map(|m| m.len());
        let _ = std::fs::remove_file(&path);
        assert_eq!(len.ok(), Some(2 << 20), "a kept store keeps its file");
        let warning = kept.lifecycle_warning(false).unwrap();
        assert!(warning.contains(",keep"), "{warning}");
        assert!(warning.contains("guest memory in the clear"), "{warning}");
        assert!(warning.contains(&path.display().to_string()), "{warning}");
        let sealed = kept.lifecycle_warning(true).unwrap();
        assert!(sealed.contains("sealed guest memory"), "{sealed}");
        // A failed open leaves no file, kept or not.
        let small = parse(&format!("file:{},keep,size=1M", path.display()));
        assert!(small.open(2 << 20, 8 << 20).is_err());
        assert!(!path.exists());
    }

    /// An `,overwrite` file is the user's: its old content is handed back
    /// to be cut on the caller's thread, nothing is cut before, the store
    /// works after it, and the file stays after the store, holding what
    /// the store wrote.
    #[test]
    fn an_overwritten_file_is_cut_when_the_caller_says_and_never_removed() {
        use std::os::unix::fs::PermissionsExt;
        let dir = blockio::test_support::test_dir();
        let path = dir.join(format!(".spec-overwrite-{}", std::process::id()));
        std::fs::write(&path, vec![0x5a; 3 << 20]).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let spec = parse(&format!("faulty:inner=file:{},overwrite", path.display()));
        let opened = spec
            .open_for_run(2 << 20, 8 << 20, &Integrity::Checksum)
            .unwrap();
        let old = opened
            .old_content
            .expect("an overwritten file has old content");
        assert_eq!(old.path(), path);
        let mode = || std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 3 << 20);
        assert_eq!(mode(), 0o644);
        old.cut().unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 0);
        assert_eq!(mode(), 0o600);
        written_and_read_back(&opened.store);
        drop(opened.store);
        let len = std::fs::metadata(&path).map(|m| m.len());
        let _ = std::fs::remove_file(&path);
        assert_eq!(len.ok(), Some(2 << 20), "the user's file stays, as written");
        let warning = spec.lifecycle_warning(false).unwrap();
        assert!(warning.contains("not removed"), "{warning}");
        assert!(warning.contains("guest memory in the clear"), "{warning}");
        // A new file has no old content.
        let fresh = parse(&format!("file:{}", path.display()))
            .open_for_run(2 << 20, 8 << 20, &Integrity::Checksum)
            .unwrap();
        assert!(fresh.old_content.is_none());
    }

    #[test]
    fn a_size_below_the_runs_need_is_refused_before_opening() {
        let need = CapacityNeed {
            guest_ram_bytes: 1 << 30,
            mem_limit_bytes: Some(256 << 20),
            unit_bytes: 2 << 20,
            in_flight_units: 32,
        };
        let path = "/nonexistent-dir/never-created";
        let err = parse(&format!("file:{path},size=512M"))
            .check_size(&need)
            .unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, StoreOpenError::TooSmallForRun { .. }),
            "{text}"
        );
        assert!(
            text.contains(&format!("size={}", (768 + 64) << 20)),
            "{text}"
        );
        parse(&format!("file:{path},size=832M"))
            .check_size(&need)
            .unwrap();
        // Without size= the store is the guest's size; memory stores count
        // compressed bytes and are not checked.
        parse(&format!("file:{path}")).check_size(&need).unwrap();
        parse("mem:lz4,size=1M").check_size(&need).unwrap();
        assert!(parse(&format!("faulty:inner=file:{path},size=2M"))
            .check_size(&need)
            .is_err());
    }

    #[test]
    fn faulty_spec_opens_a_store_that_fails() {
        let store = parse("faulty:read-error-after=0,inner=mem:lz4")
            .open(2 << 20, 8 << 20)
            .unwrap();
        let img = unit_image(1, 2 << 20);
        let slot = store.write_batch(&[WriteRequest {
            gpa: StoreKey::new(0x20_0000),
            data: &img,
        }])[0]
            .as_ref()
            .copied()
            .unwrap();
        let mut buf = AlignedBuf::new(2 << 20, 4096);
        let err = store
            .read(slot, StoreKey::new(0x20_0000), &mut buf)
            .unwrap_err();
        assert!(matches!(err, StoreError::Io { gpa, .. } if gpa == StoreKey::new(0x20_0000)));
        assert!(err.to_string().contains("0x200000"));
    }
}
