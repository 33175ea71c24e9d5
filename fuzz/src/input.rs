//! Reading a fuzz input as a stream of numbers and byte strings.
//!
//! Past the end every read yields zeros (or an empty slice), so a target
//! never has to handle a short input specially, and libFuzzer's mutations
//! that shorten an input change the tail of the decoded operations only.

/// A cursor over the fuzzer's bytes.
#[derive(Debug, Clone)]
pub struct Input<'a> {
    data: &'a [u8],
}

impl<'a> Input<'a> {
    /// Reads from the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Self { data }
    }

    /// Whether everything has been read.
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }

    /// The bytes not read yet, consuming them.
    pub fn rest(&mut self) -> &'a [u8] {
        std::mem::take(&mut self.data)
    }

    /// Up to `n` bytes.
    pub fn bytes(&mut self, n: usize) -> &'a [u8] {
        let (head, tail) = self.data.split_at(n.min(self.data.len()));
        self.data = tail;
        head
    }

    fn array<const N: usize>(&mut self) -> [u8; N] {
        let mut out = [0u8; N];
        let head = self.bytes(N);
        out[..head.len()].copy_from_slice(head);
        out
    }

    /// A byte.
    pub fn u8(&mut self) -> u8 {
        self.array::<1>()[0]
    }

    /// A little-endian `u16`.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes(self.array())
    }

    /// A little-endian `u32`.
    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes(self.array())
    }

    /// A little-endian `u64`.
    pub fn u64(&mut self) -> u64 {
        u64::from_le_bytes(self.array())
    }

    /// A length-prefixed (one byte) byte string.
    pub fn short_bytes(&mut self) -> &'a [u8] {
        let n = usize::from(self.u8());
        self.bytes(n)
    }
}

/// Builds inputs that [`Input`] reads back: the seed generators use it.
#[derive(Debug, Default, Clone)]
pub struct InputWriter {
    out: Vec<u8>,
}

impl InputWriter {
    /// An empty input.
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.out.push(v);
        self
    }

    /// Appends a little-endian `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends a little-endian `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.out.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// Appends raw bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.out.extend_from_slice(v);
        self
    }

    /// Appends a byte string with its one-byte length; at most 255 bytes.
    pub fn short_bytes(&mut self, v: &[u8]) -> &mut Self {
        let len = u8::try_from(v.len()).expect("short_bytes takes at most 255 bytes");
        self.u8(len).bytes(v)
    }

    /// The input.
    pub fn finish(&self) -> Vec<u8> {
        self.out.clone()
    }
}
