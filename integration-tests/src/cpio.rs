//! A minimal writer (and, for its tests, reader) of the "newc" cpio format
//! the kernel unpacks an initramfs from: the Linux boot tests
//! (`tests/linux.rs`) pack their initramfs with it.

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    /// A directory.
    Dir,
    /// A regular file with this content.
    File(Vec<u8>),
    /// A symbolic link to this target.
    Symlink(String),
    /// A character device node.
    CharDevice {
        /// Major number.
        major: u32,
        /// Minor number.
        minor: u32,
    },
}

/// One archive member; `perm` is the permission bits only.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Path inside the archive, without a leading `/`.
    pub name: String,
    /// Permission bits (the file type comes from `kind`).
    pub perm: u32,
    /// What the entry is.
    pub kind: Kind,
}

const MAGIC: &str = "070701";
const HEADER_BYTES: usize = 110;
const TRAILER: &str = "TRAILER!!!";
const S_IFDIR: u32 = 0o040000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;
const S_IFCHR: u32 = 0o020000;
const S_IFMT: u32 = 0o170000;

fn pad4(out: &mut Vec<u8>) {
    out.resize(out.len().next_multiple_of(4), 0);
}

fn member(out: &mut Vec<u8>, ino: u32, mode: u32, rdev: (u32, u32), name: &str, data: &[u8]) {
    let nlink = if mode & S_IFMT == S_IFDIR { 2 } else { 1 };
    // ino, mode, uid, gid, nlink, mtime, filesize, devmajor, devminor,
    // rdevmajor, rdevminor, namesize (with its NUL), check.
    let fields = [
        ino,
        mode,
        0,
        0,
        nlink,
        0,
        data.len() as u32,
        0,
        0,
        rdev.0,
        rdev.1,
        name.len() as u32 + 1,
        0,
    ];
    out.extend_from_slice(MAGIC.as_bytes());
    for field in fields {
        out.extend_from_slice(format!("{field:08x}").as_bytes());
    }
    out.extend_from_slice(name.as_bytes());
    out.push(0);
    // The name is padded so that header + name is a multiple of 4 (the
    // header starts 4-aligned), then the data likewise.
    pad4(out);
    out.extend_from_slice(data);
    pad4(out);
}

/// The archive: the entries in order (parents before children), then
/// the trailer.
pub fn newc(entries: &[Entry]) -> Vec<u8> {
    let mut out = Vec::new();
    for (i, e) in entries.iter().enumerate() {
        let ino = i as u32 + 1;
        match &e.kind {
            Kind::Dir => member(&mut out, ino, S_IFDIR | e.perm, (0, 0), &e.name, &[]),
            Kind::File(data) => member(&mut out, ino, S_IFREG | e.perm, (0, 0), &e.name, data),
            Kind::Symlink(target) => member(
                &mut out,
                ino,
                S_IFLNK | e.perm,
                (0, 0),
                &e.name,
                target.as_bytes(),
            ),
            Kind::CharDevice { major, minor } => member(
                &mut out,
                ino,
                S_IFCHR | e.perm,
                (*major, *minor),
                &e.name,
                &[],
            ),
        }
    }
    member(&mut out, 0, 0, (0, 0), TRAILER, &[]);
    out
}

/// Reads back what [`newc`] writes; errors name the offset.
pub fn parse(bytes: &[u8]) -> Result<Vec<Entry>, String> {
    let mut entries = Vec::new();
    let mut at = 0;
    loop {
        let header = bytes
            .get(at..at + HEADER_BYTES)
            .ok_or(format!("truncated header at {at}"))?;
        if &header[..6] != MAGIC.as_bytes() {
            return Err(format!("bad magic at {at}"));
        }
        let header_at = at;
        let field = |i: usize| {
            let text =
                std::str::from_utf8(&header[6 + 8 * i..14 + 8 * i]).map_err(|e| e.to_string())?;
            u32::from_str_radix(text, 16).map_err(|e| format!("field {i} at {header_at}: {e}"))
        };
        let (mode, size, namesize) = (field(1)?, field(6)? as usize, field(11)? as usize);
        let name_at = at + HEADER_BYTES;
        let name = bytes
            .get(name_at..name_at + namesize)
            .ok_or(format!("truncated name at {name_at}"))?;
        let name = std::str::from_utf8(name.strip_suffix(&[0]).ok_or("name without NUL")?)
            .map_err(|e| e.to_string())?
            .to_string();
        let data_at = (name_at + namesize).next_multiple_of(4);
        let data = bytes
            .get(data_at..data_at + size)
            .ok_or(format!("truncated data at {data_at}"))?
            .to_vec();
        at = (data_at + size).next_multiple_of(4);
        if name == TRAILER {
            if at != bytes.len() {
                return Err(format!("{} bytes after the trailer", bytes.len() - at));
            }
            return Ok(entries);
        }
        let kind = match mode & S_IFMT {
            S_IFDIR => Kind::Dir,
            S_IFREG => Kind::File(data),
            S_IFLNK => Kind::Symlink(String::from_utf8(data).map_err(|e| e.to_string())?),
            S_IFCHR => Kind::CharDevice {
                major: field(9)?,
                minor: field(10)?,
            },
            other => return Err(format!("{name}: unexpected file type {other:o}")),
        };
        entries.push(Entry {
            name,
            perm: mode & 0o7777,
            kind,
        });
    }
}
