//! Sealing: what `--swap-encrypt` does to every image a store keeps.
//!
//! Each image is encrypted and authenticated with AES-256-GCM (`ring`,
//! which uses AES-NI, PCLMULQDQ and, where the CPU has them, VAES and
//! VPCLMULQDQ) in place of the crc32 the store would otherwise take: the
//! 16-byte tag *is* the integrity check (docs/ENCRYPTION.md). The sealing
//! unit is the store's integrity unit (docs/SPLIT_CHUNKS.md): a huge
//! chunk's slot, a split chunk's page, a 4 KiB unit.
//!
//! - **Key.** One AES-256 key per run: 32 random bytes from the OS
//!   ([`Sealer::random`]), or, with an operator key file, HKDF-SHA256 of
//!   that key with a random 32-byte salt drawn at start
//!   ([`Sealer::from_key_file`]): a per-run subkey. It lives in a
//!   [`SecretPage`] (locked in RAM, `MADV_DONTDUMP`, `MADV_DONTFORK`,
//!   zeroed on drop) while it is expanded, and is wiped there once the
//!   expanded key schedule, which stays in the page, is made.
//! - **Nonce.** 96 bits: 32 zero bits and a 64-bit *write generation* that
//!   the sealer hands out once per seal, counting up from 1. Every seal
//!   under one key gets a generation no other seal under that key had, so
//!   no nonce repeats, whatever slot or page it is for. The key never
//!   outlives the run (the store is per run), and a new run has a new key
//!   (random, or a subkey under a fresh salt), so counters restarting at 1
//!   in the next run reuse no (key, nonce) pair.
//! - **Associated data** binds where the image belongs: the slot, the page
//!   (or "whole unit"), its length, the guest address and the generation.
//!   The store keeps the generation and the tag of each slot (or page) in
//!   its own memory, never in the medium, so an image that was changed
//!   (a flipped bit), copied from another slot (another slot, address and
//!   generation) or written back from an older write (an older generation
//!   whose tag the store no longer expects) fails to open:
//!   [`StoreError::Authentication`], naming the guest address. ring zeroes
//!   the buffer of a failed open, and the engine installs nothing after a
//!   store error.

use std::io::Read;
use std::mem::{align_of, size_of};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use guestmem::host::{SecretPage, SecretPageError};
use ring::aead::{Aad, LessSafeKey, Nonce, Tag, UnboundKey, AES_256_GCM, NONCE_LEN};
use ring::hkdf;
use ring::rand::{SecureRandom, SystemRandom};
use zeroize::{Zeroize, Zeroizing};

use super::{SlotId, StoreError};
use crate::index::{PageIndex, StoreKey};

/// Bytes of an AES-256 key, and of an operator key file.
pub const KEY_BYTES: usize = 32;
/// Bytes of a GCM tag.
pub const TAG_BYTES: usize = 16;
/// Bytes of the random HKDF salt drawn per run.
pub const SALT_BYTES: usize = 32;
/// HKDF's `info`: names what the subkey is for, so the same operator key
/// used for something else one day derives another key.
const HKDF_INFO: &[u8] = b"hugevmm swap store AES-256-GCM sealing key, v1";
/// First field of the associated data: the format of what is sealed.
const AD_DOMAIN: &[u8; 8] = b"hvmmswp1";
/// The page field of a whole unit's associated data.
const WHOLE_UNIT: u32 = u32::MAX;

/// What the store keeps for one sealed image: the generation it was sealed
/// under (its nonce) and its tag. 24 bytes, in the store's memory only.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Seal {
    /// The write generation: the nonce, and part of the associated data.
    /// 0 is never handed out (a record never sealed).
    pub generation: u64,
    /// The GCM tag.
    pub tag: [u8; TAG_BYTES],
}

/// Where an image belongs: bound into its associated data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Place {
    /// The slot.
    pub slot: SlotId,
    /// The page of a paged slot (split chunk), or `None` for the whole unit.
    pub page: Option<PageIndex>,
    /// Guest address of the unit or page.
    pub gpa: StoreKey,
}

impl Place {
    /// A whole unit in `slot`.
    pub fn unit(slot: SlotId, gpa: StoreKey) -> Place {
        Place {
            slot,
            page: None,
            gpa,
        }
    }

    /// Page `page` of the paged `slot`, at guest address `gpa`.
    pub fn page(slot: SlotId, page: PageIndex, gpa: StoreKey) -> Place {
        Place {
            slot,
            page: Some(page),
            gpa,
        }
    }
}

/// Why no sealer could be made: each message says what to do.
#[derive(Debug, thiserror::Error)]
pub enum SealKeyError {
    /// The key file cannot be opened or read.
    #[error("cannot read --swap-key-file {shown}: {source}; give a file of exactly 32 random bytes, e.g. `head -c 32 /dev/urandom > {shown} && chmod 600 {shown}`", shown = path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The key file is not a regular file.
    #[error("--swap-key-file {} is not a regular file; give a file of exactly 32 random bytes", path.display())]
    NotAFile {
        /// The file.
        path: PathBuf,
    },
    /// Others than its owner may read or write the key file.
    #[error("--swap-key-file {} has mode {mode:04o}: a key others may read or write protects nothing; run `chmod 600 {}`", path.display(), path.display())]
    Permissions {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
    },
    /// The key file belongs to another user than the one running hugevmm
    /// (and not to root): its owner could change the key.
    #[error("--swap-key-file {} belongs to uid {uid}, not to the user running hugevmm (uid {euid}) or root: its owner can change the key; use a key file of your own (`chown {euid} {}`, as root)", path.display(), path.display())]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// The user running hugevmm.
        euid: u32,
    },
    /// The key file is not exactly [`KEY_BYTES`] long.
    #[error("--swap-key-file {} holds {got_bytes} bytes, not 32: it must hold exactly 32 random bytes (a raw AES-256 key), e.g. `head -c 32 /dev/urandom > {} && chmod 600 {}`", path.display(), path.display(), path.display(), got_bytes = if *more { ">32".to_string() } else { got_bytes.to_string() })]
    Length {
        /// The file.
        path: PathBuf,
        /// Bytes read.
        got_bytes: usize,
        /// Whether there were more than 32.
        more: bool,
    },
    /// The OS random number generator failed.
    #[error("cannot draw a random swap key from the OS (getrandom failed)")]
    Random,
    /// The key's page could not be locked or hidden from dumps.
    #[error(transparent)]
    Page(#[from] SecretPageError),
}

/// How the run's key came to be, for [`Sealer::describe`].
#[derive(Debug, Clone)]
enum KeyOrigin {
    Random,
    Derived {
        path: PathBuf,
        salt: [u8; SALT_BYTES],
    },
}

/// Where the raw key bytes sit in the secret page while the key is
/// expanded (the expanded key at 0); wiped right after.
const RAW_KEY_OFFSET: usize = 2048;

// The expanded key and the raw key share one page without overlapping.
const _: () = assert!(size_of::<LessSafeKey>() <= RAW_KEY_OFFSET);
const _: () = assert!(align_of::<LessSafeKey>() <= 64);
const _: () = assert!(RAW_KEY_OFFSET + KEY_BYTES <= SecretPage::BYTES);

/// The run's key in a [`SecretPage`]: ring's expanded key at the start of
/// the page; the raw key bytes it was made from were at
/// [`RAW_KEY_OFFSET`], zeroed once it was made.
struct KeyHolder {
    page: SecretPage,
}

impl KeyHolder {
    /// A page whose raw key bytes `fill` writes; then the key is expanded
    /// in the page.
    fn new(
        fill: impl FnOnce(&mut [u8; KEY_BYTES]) -> Result<(), SealKeyError>,
    ) -> Result<KeyHolder, SealKeyError> {
        let page = SecretPage::new()?;
        // SAFETY: the page is mapped read-write, zeroed, owned here, and
        // [RAW_KEY_OFFSET, +32) lies inside it (asserted above); no other
        // reference to it exists.
        let raw = unsafe {
            &mut *page
                .as_mut_ptr()
                .add(RAW_KEY_OFFSET)
                .cast::<[u8; KEY_BYTES]>()
        };
        fill(raw)?;
        let key = LessSafeKey::new(
            UnboundKey::new(&AES_256_GCM, raw).expect("a 32-byte key is an AES-256 key"),
        );
        // The key schedule is all sealing needs: the raw bytes go, so that
        // a reader of this page (a core dump that ignored MADV_DONTDUMP, a
        // bug that leaks it) finds no key in its plain form.
        raw.zeroize();
        // The expanded key moves into the page; the moved-from copy on
        // this stack frame is overwritten by later calls (ring's key types
        // cannot be zeroized; docs/ENCRYPTION.md says what that leaves).
        // SAFETY: the page start is page aligned (>= the key's alignment,
        // asserted above), large enough (asserted), holds no value yet, and
        // `Drop` drops the key in place before the page is wiped.
        unsafe { page.as_mut_ptr().cast::<LessSafeKey>().write(key) };
        Ok(KeyHolder { page })
    }

    fn key(&self) -> &LessSafeKey {
        // SAFETY: `new` wrote a LessSafeKey there, which lives until drop;
        // only shared references are ever made to it.
        unsafe { &*self.page.as_mut_ptr().cast::<LessSafeKey>() }
    }
}

impl Drop for KeyHolder {
    fn drop(&mut self) {
        // SAFETY: the key written in `new` is dropped exactly once, here;
        // no reference to it outlives `self`. The page is then zeroed and
        // unmapped by its own drop.
        unsafe { ptr::drop_in_place(self.page.as_mut_ptr().cast::<LessSafeKey>()) };
    }
}

/// The run's sealing key and write-generation counter, shared by a store's
/// threads. See the module docs.
pub struct Sealer {
    key: KeyHolder,
    next_generation: AtomicU64,
    origin: KeyOrigin,
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Sealer")
            .field("origin", &self.describe())
            .finish_non_exhaustive()
    }
}

impl Sealer {
    /// A sealer under a fresh random key that exists only in this process.
    pub fn random() -> Result<Sealer, SealKeyError> {
        let key = KeyHolder::new(|raw| {
            SystemRandom::new()
                .fill(raw)
                .map_err(|_| SealKeyError::Random)
        })?;
        Ok(Sealer::with_key(key, KeyOrigin::Random))
    }

    /// A sealer under a per-run subkey of the operator's key in `path`
    /// (exactly 32 bytes, a regular file of the user running hugevmm or
    /// root, which its owner alone may read and write): HKDF-SHA256 with a
    /// random salt drawn now.
    pub fn from_key_file(path: &Path) -> Result<Sealer, SealKeyError> {
        let unreadable = |source| SealKeyError::Unreadable {
            path: path.to_owned(),
            source,
        };
        // Non-blocking: a FIFO (or a device) opens at once and is refused
        // below, instead of holding the start until someone writes to it.
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
            .open(path)
            .map_err(unreadable)?;
        let meta = file.metadata().map_err(unreadable)?;
        if !meta.file_type().is_file() {
            return Err(SealKeyError::NotAFile {
                path: path.to_owned(),
            });
        }
        // SAFETY: geteuid has no preconditions and cannot fail.
        let euid = unsafe { libc::geteuid() };
        if meta.uid() != euid && meta.uid() != 0 {
            return Err(SealKeyError::Owner {
                path: path.to_owned(),
                uid: meta.uid(),
                euid,
            });
        }
        let mode = meta.mode() & 0o7777;
        if mode & 0o077 != 0 {
            return Err(SealKeyError::Permissions {
                path: path.to_owned(),
                mode,
            });
        }
        // Into a fixed buffer that is wiped on drop: a growing Vec would
        // leave copies behind in the memory it gives back.
        let mut operator = Zeroizing::new([0u8; KEY_BYTES + 1]);
        let mut got_bytes = 0;
        while got_bytes < operator.len() {
            match file.read(&mut operator[got_bytes..]) {
                Ok(0) => break,
                Ok(n) => got_bytes += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(unreadable(e)),
            }
        }
        if got_bytes != KEY_BYTES {
            return Err(SealKeyError::Length {
                path: path.to_owned(),
                got_bytes,
                more: got_bytes > KEY_BYTES,
            });
        }
        Sealer::derived(&operator[..KEY_BYTES], path.to_owned())
    }

    /// A sealer under a per-run subkey of `operator` (32 bytes): HKDF with
    /// a random salt. `path` only names the key in [`Sealer::describe`].
    fn derived(operator: &[u8], path: PathBuf) -> Result<Sealer, SealKeyError> {
        let rng = SystemRandom::new();
        let mut salt = [0u8; SALT_BYTES];
        rng.fill(&mut salt).map_err(|_| SealKeyError::Random)?;
        let key = KeyHolder::new(|raw| {
            let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &salt).extract(operator);
            prk.expand(&[HKDF_INFO], &AES_256_GCM)
                .and_then(|okm| okm.fill(raw))
                .expect("32 bytes is within HKDF-SHA256's output");
            Ok(())
        })?;
        Ok(Sealer::with_key(key, KeyOrigin::Derived { path, salt }))
    }

    /// Test aid: a sealer under a subkey of a key given in memory, so that
    /// two sealers of one operator key can be compared.
    #[cfg(test)]
    pub(crate) fn from_operator_key(operator: &[u8; KEY_BYTES]) -> Result<Sealer, SealKeyError> {
        Sealer::derived(operator, PathBuf::from("(test key)"))
    }

    fn with_key(key: KeyHolder, origin: KeyOrigin) -> Sealer {
        Sealer {
            key,
            next_generation: AtomicU64::new(1),
            origin,
        }
    }

    /// The cipher and where the key came from (never the key), e.g. for
    /// the store's description. The salt is not secret.
    pub fn describe(&self) -> String {
        match &self.origin {
            KeyOrigin::Random => "sealed: AES-256-GCM, random per-run key".to_string(),
            KeyOrigin::Derived { path, salt } => {
                let salt: String = salt.iter().map(|b| format!("{b:02x}")).collect();
                format!(
                    "sealed: AES-256-GCM, per-run subkey of {} (HKDF-SHA256, salt {salt})",
                    path.display()
                )
            }
        }
    }

    /// Seals generations handed out so far (for tests and stats).
    pub fn seals(&self) -> u64 {
        self.next_generation.load(Ordering::Relaxed) - 1
    }

    fn nonce(generation: u64) -> Nonce {
        let mut n = [0u8; NONCE_LEN];
        n[NONCE_LEN - 8..].copy_from_slice(&generation.to_be_bytes());
        Nonce::assume_unique_for_key(n)
    }

    fn aad(at: Place, len: usize, generation: u64) -> [u8; 36] {
        let mut ad = [0u8; 36];
        ad[..8].copy_from_slice(AD_DOMAIN);
        ad[8..12].copy_from_slice(&at.slot.get().to_le_bytes());
        let page = at.page.map_or(WHOLE_UNIT, |p| p.get() as u32);
        ad[12..16].copy_from_slice(&page.to_le_bytes());
        ad[16..20].copy_from_slice(&(len as u32).to_le_bytes());
        ad[20..28].copy_from_slice(&at.gpa.raw().to_le_bytes());
        ad[28..36].copy_from_slice(&generation.to_le_bytes());
        ad
    }

    /// Encrypts `data` in place as the image of `at`, under a generation
    /// no seal had before; returns what the store keeps to open it.
    pub fn seal(&self, at: Place, data: &mut [u8]) -> Result<Seal, StoreError> {
        let generation = self.next_generation.fetch_add(1, Ordering::Relaxed);
        if generation == u64::MAX {
            // 2^64 seals do not happen in a run; refusing beats wrapping
            // into a nonce already used.
            return Err(StoreError::Io {
                gpa: at.gpa,
                slot: at.slot,
                source: std::io::Error::other("the swap store's write generations are used up"),
            });
        }
        let aad = Self::aad(at, data.len(), generation);
        let tag = self
            .key
            .key()
            .seal_in_place_separate_tag(Self::nonce(generation), Aad::from(&aad), data)
            .map_err(|_| StoreError::Io {
                gpa: at.gpa,
                slot: at.slot,
                source: std::io::Error::other("AES-256-GCM refused to seal the image"),
            })?;
        let mut out = [0u8; TAG_BYTES];
        out.copy_from_slice(tag.as_ref());
        Ok(Seal {
            generation,
            tag: out,
        })
    }

    /// Decrypts `data` in place if it is the image sealed as `seal` for
    /// `at`; otherwise [`StoreError::Authentication`] and `data` zeroed.
    pub fn open(&self, at: Place, seal: Seal, data: &mut [u8]) -> Result<(), StoreError> {
        let aad = Self::aad(at, data.len(), seal.generation);
        self.key
            .key()
            .open_in_place_separate_tag(
                Self::nonce(seal.generation),
                Aad::from(&aad),
                Tag::from(seal.tag),
                data,
                0..,
            )
            .map(|_| ())
            .map_err(|_| StoreError::Authentication {
                gpa: at.gpa,
                slot: at.slot,
                generation: seal.generation,
            })
    }
}

/// What a store keeps for one image to verify it when read back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Check {
    /// crc32 of the image as written (no `--swap-encrypt`).
    Crc(u32),
    /// The image is sealed: its generation and tag.
    Sealed(Seal),
}

/// How a store protects what it keeps: a crc32 per image, or sealing.
#[derive(Clone, Debug, Default)]
pub enum Integrity {
    /// crc32 per image, content in the clear.
    #[default]
    Checksum,
    /// Sealed under the run's key.
    Sealed(Arc<Sealer>),
}

impl Integrity {
    /// Whether images are sealed.
    pub fn is_sealed(&self) -> bool {
        matches!(self, Integrity::Sealed(_))
    }

    /// Protects `data`, the image of `at`: its crc32, or sealed in place
    /// (then `data` is the ciphertext to store).
    pub fn protect(&self, at: Place, data: &mut [u8]) -> Result<Check, StoreError> {
        match self {
            Integrity::Checksum => Ok(Check::Crc(crc32fast::hash(data))),
            Integrity::Sealed(sealer) => sealer.seal(at, data).map(Check::Sealed),
        }
    }

    /// Verifies `data` read back for `at` against `check`, opening it in
    /// place when sealed. Never `Ok` with anything but the bytes written.
    pub fn verify(&self, at: Place, check: Check, data: &mut [u8]) -> Result<(), StoreError> {
        match (self, check) {
            (Integrity::Checksum, Check::Crc(expected)) => {
                let found = crc32fast::hash(data);
                if found == expected {
                    Ok(())
                } else {
                    Err(StoreError::Checksum {
                        gpa: at.gpa,
                        slot: at.slot,
                        expected,
                        found,
                    })
                }
            }
            (Integrity::Sealed(sealer), Check::Sealed(seal)) => sealer.open(at, seal, data),
            _ => Err(StoreError::Io {
                gpa: at.gpa,
                slot: at.slot,
                source: std::io::Error::other(
                    "the slot's record does not match the store's integrity mode (a store bug)",
                ),
            }),
        }
    }

    /// "sealed: ..." or "crc32", for descriptions.
    pub fn describe(&self) -> String {
        match self {
            Integrity::Checksum => "crc32".to_string(),
            Integrity::Sealed(sealer) => sealer.describe(),
        }
    }
}

/// The per-slot (or per-page) records of a store, kept compact: 4 bytes a
/// record with checksums, 24 sealed. Grows as higher indices are set.
#[derive(Debug, Clone)]
pub(crate) enum CheckTable {
    Crc(Vec<u32>),
    Sealed(Vec<Seal>),
}

impl CheckTable {
    /// An empty table for `integrity`.
    pub(crate) fn new(integrity: &Integrity) -> CheckTable {
        CheckTable::with_len(integrity, 0)
    }

    /// A table of `len` unset records.
    pub(crate) fn with_len(integrity: &Integrity, len: usize) -> CheckTable {
        if integrity.is_sealed() {
            CheckTable::Sealed(vec![Seal::default(); len])
        } else {
            CheckTable::Crc(vec![0; len])
        }
    }

    /// Records `check` at `idx`.
    pub(crate) fn set(&mut self, idx: usize, check: Check) {
        match (self, check) {
            (CheckTable::Crc(v), Check::Crc(crc)) => {
                if v.len() <= idx {
                    v.resize(idx + 1, 0);
                }
                v[idx] = crc;
            }
            (CheckTable::Sealed(v), Check::Sealed(seal)) => {
                if v.len() <= idx {
                    v.resize(idx + 1, Seal::default());
                }
                v[idx] = seal;
            }
            // Integrity::protect made `check` for this table's mode.
            _ => unreachable!("a check of the other integrity mode"),
        }
    }

    /// The record at `idx` (the caller knows it was set).
    pub(crate) fn get(&self, idx: usize) -> Option<Check> {
        match self {
            CheckTable::Crc(v) => v.get(idx).copied().map(Check::Crc),
            CheckTable::Sealed(v) => v.get(idx).copied().map(Check::Sealed),
        }
    }

    /// Bytes of one record.
    pub(crate) fn record_bytes(&self) -> usize {
        match self {
            CheckTable::Crc(_) => size_of::<u32>(),
            CheckTable::Sealed(_) => size_of::<Seal>(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer() -> Arc<Sealer> {
        Arc::new(Sealer::random().expect("a random sealer"))
    }

    #[test]
    fn seal_then_open_round_trips_and_hides_the_content() {
        let s = sealer();
        let plain: Vec<u8> = (0..8192u32).map(|i| (i % 251) as u8).collect();
        let mut data = plain.clone();
        let at = Place::unit(SlotId::new(3), StoreKey::new(0x60_0000));
        let seal = s.seal(at, &mut data).unwrap();
        assert_ne!(data, plain);
        assert_eq!(seal.generation, 1);
        s.open(at, seal, &mut data).unwrap();
        assert_eq!(data, plain);
    }

    #[test]
    fn every_binding_is_checked() {
        let s = sealer();
        let plain = vec![0x42u8; 4096];
        let at = Place::page(SlotId::new(7), PageIndex::new(5), StoreKey::new(0x20_5000));
        let mut sealed = plain.clone();
        let seal = s.seal(at, &mut sealed).unwrap();
        let fails = |at: Place, seal: Seal, data: &[u8]| {
            let mut d = data.to_vec();
            match s.open(at, seal, &mut d) {
                Err(StoreError::Authentication { gpa, .. }) => {
                    assert_eq!(gpa, at.gpa);
                    assert!(d.iter().all(|&b| b == 0), "a failed open leaves zeros");
                }
                other => panic!("expected an authentication error, got {other:?}"),
            }
        };
        let mut flipped = sealed.clone();
        flipped[100] ^= 1;
        fails(at, seal, &flipped);
        fails(
            Place {
                slot: SlotId::new(8),
                ..at
            },
            seal,
            &sealed,
        );
        fails(
            Place {
                page: Some(PageIndex::new(6)),
                ..at
            },
            seal,
            &sealed,
        );
        fails(Place { page: None, ..at }, seal, &sealed);
        fails(
            Place {
                gpa: StoreKey::new(0x20_6000),
                ..at
            },
            seal,
            &sealed,
        );
        fails(
            at,
            Seal {
                generation: 2,
                ..seal
            },
            &sealed,
        );
        let mut tag = seal.tag;
        tag[0] ^= 0x80;
        fails(at, Seal { tag, ..seal }, &sealed);
        // Another run's key (a new random key) opens nothing of this one.
        let other = sealer();
        let mut d = sealed.clone();
        assert!(other.open(at, seal, &mut d).is_err());
    }

    #[test]
    fn generations_never_repeat_across_threads() {
        let s = sealer();
        let gens: Vec<u64> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|t| {
                    let s = &s;
                    scope.spawn(move || {
                        (0..500)
                            .map(|i| {
                                let mut d = [t as u8; 64];
                                s.seal(Place::unit(SlotId::new(i), StoreKey::new(0)), &mut d)
                                    .unwrap()
                                    .generation
                            })
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| h.join().unwrap())
                .collect()
        });
        let mut sorted = gens.clone();
        sorted.sort_unstable();
        sorted.dedup();
        assert_eq!(sorted.len(), 2000);
        assert_eq!(s.seals(), 2000);
    }

    #[test]
    fn one_operator_key_gives_a_new_subkey_per_run() {
        let operator = [9u8; KEY_BYTES];
        let (a, b) = (
            Sealer::from_operator_key(&operator).unwrap(),
            Sealer::from_operator_key(&operator).unwrap(),
        );
        // Same position, same generation, same plaintext: different
        // ciphertexts, because the salts (and so the subkeys) differ.
        let at = Place::unit(SlotId::new(0), StoreKey::new(0));
        let (mut x, mut y) = (vec![1u8; 4096], vec![1u8; 4096]);
        let (sx, sy) = (a.seal(at, &mut x).unwrap(), b.seal(at, &mut y).unwrap());
        assert_eq!(sx.generation, sy.generation);
        assert_ne!(x, y);
        assert!(b.open(at, sx, &mut x).is_err());
        assert!(
            a.describe().contains("HKDF-SHA256, salt "),
            "{}",
            a.describe()
        );
        assert_ne!(a.describe(), b.describe());
    }

    fn key_file(name: &str, bytes: &[u8], mode: u32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = std::env::temp_dir().join(format!("hugevmm-key-{name}-{}", std::process::id()));
        std::fs::write(&path, bytes).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
        path
    }

    #[test]
    fn key_files_are_checked_and_each_error_says_what_to_do() {
        let good = key_file("good", &[7u8; 32], 0o600);
        let sealer = Sealer::from_key_file(&good).unwrap();
        assert!(sealer.describe().contains(&good.display().to_string()));
        let short = key_file("short", &[7u8; 31], 0o600);
        let long = key_file("long", &[7u8; 64], 0o400);
        let open = key_file("open", &[7u8; 32], 0o644);
        let missing = std::env::temp_dir().join("hugevmm-key-missing-nowhere");
        let cases = [
            (&short, "holds 31 bytes, not 32"),
            (&long, "holds >32 bytes"),
            (&open, "chmod 600"),
            (&missing, "head -c 32 /dev/urandom"),
        ];
        for (path, want) in cases {
            let err = Sealer::from_key_file(path).unwrap_err().to_string();
            assert!(err.contains(want), "{err}");
            assert!(err.contains(&path.display().to_string()), "{err}");
        }
        let err = Sealer::from_key_file(&std::env::temp_dir()).unwrap_err();
        assert!(matches!(err, SealKeyError::NotAFile { .. }), "{err}");
        for p in [good, short, long, open] {
            std::fs::remove_file(p).unwrap();
        }
    }

    /// The raw key bytes the page held while the key was expanded.
    fn raw_key_area(sealer: &Sealer) -> [u8; KEY_BYTES] {
        // SAFETY: the page is mapped read-write for the sealer's life, and
        // [RAW_KEY_OFFSET, +32) lies inside it (asserted at the top).
        unsafe {
            sealer
                .key
                .page
                .as_mut_ptr()
                .add(RAW_KEY_OFFSET)
                .cast::<[u8; KEY_BYTES]>()
                .read_volatile()
        }
    }

    #[test]
    fn the_raw_key_is_wiped_once_expanded() {
        let path = key_file("wiped", &[7u8; 32], 0o600);
        let derived = Sealer::from_key_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        for sealer in [sealer(), Arc::new(derived)] {
            assert_eq!(raw_key_area(&sealer), [0u8; KEY_BYTES], "{sealer:?}");
            // The expanded key still seals and opens.
            let at = Place::unit(SlotId::new(0), StoreKey::new(0));
            let mut data = vec![3u8; 4096];
            let seal = sealer.seal(at, &mut data).unwrap();
            sealer.open(at, seal, &mut data).unwrap();
            assert_eq!(data, vec![3u8; 4096]);
        }
    }

    #[test]
    fn a_fifo_key_file_is_refused_at_once() {
        let path = std::env::temp_dir().join(format!("hugevmm-key-fifo-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let c_path = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
        // SAFETY: mkfifo reads the NUL-terminated path, which lives across
        // the call.
        assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0);
        let (done_tx, done) = std::sync::mpsc::channel();
        let opened = path.clone();
        std::thread::spawn(move || {
            let _ = done_tx.send(Sealer::from_key_file(&opened).map(|_| ()));
        });
        // A bound on a wait, not a measurement: opening a FIFO without a
        // writer blocks for ever unless it is opened non-blocking.
        let answer = done.recv_timeout(std::time::Duration::from_secs(60));
        if answer.is_err() {
            // Unblock the thread stuck in open before failing.
            let _ = std::fs::OpenOptions::new().write(true).open(&path);
        }
        std::fs::remove_file(&path).unwrap();
        let err = answer
            .expect("reading a FIFO key file blocked: no writer will ever come")
            .unwrap_err();
        assert!(matches!(err, SealKeyError::NotAFile { .. }), "{err}");
    }

    #[test]
    fn a_key_file_someone_else_owns_is_refused() {
        // SAFETY: geteuid has no preconditions and cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            test_resources::skip(
                "a_key_file_someone_else_owns_is_refused",
                test_resources::Resource::OtherUser,
                "not root: cannot give a file to another user",
            );
            return;
        }
        let path = key_file("owner", &[7u8; 32], 0o600);
        std::os::unix::fs::chown(&path, Some(65534), Some(65534)).unwrap();
        let err = Sealer::from_key_file(&path).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, SealKeyError::Owner { uid: 65534, .. }),
            "{text}"
        );
        assert!(text.contains("chown"), "{text}");
        // Root's own file (the owner here) is accepted.
        std::os::unix::fs::chown(&path, Some(0), Some(0)).unwrap();
        Sealer::from_key_file(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
    }

    #[test]
    fn check_tables_keep_their_mode() {
        let mut crc = CheckTable::new(&Integrity::Checksum);
        crc.set(3, Check::Crc(5));
        assert_eq!(crc.get(3), Some(Check::Crc(5)));
        assert_eq!(crc.get(9), None);
        assert_eq!(crc.record_bytes(), 4);
        let sealed = Integrity::Sealed(sealer());
        let mut t = CheckTable::with_len(&sealed, 2);
        let mut data = [1u8; 16];
        let check = sealed
            .protect(Place::unit(SlotId::new(1), StoreKey::new(0)), &mut data)
            .unwrap();
        t.set(1, check);
        assert_eq!(t.get(1), Some(check));
        assert_eq!(t.record_bytes(), 24);
    }
}
