//! The payload console on port 0x3f8: one line buffer per vCPU, whole lines
//! written under one lock so lines of different vCPUs never interleave.

use std::io::Write;
use std::sync::{Arc, Mutex};

/// Where finished lines go (stdout for the CLI, a buffer in tests).
pub type ConsoleSink = Arc<Mutex<Box<dyn Write + Send>>>;

/// One vCPU's view of the console.
pub struct VcpuConsole {
    line: Vec<u8>,
    sink: ConsoleSink,
}

/// Longest line kept before it is flushed without a newline, so a payload
/// that never prints `\n` cannot grow the VMM's memory without bound.
const MAX_LINE_BYTES: usize = 64 << 10;

impl VcpuConsole {
    /// A console writing whole lines to `sink`.
    pub fn new(sink: ConsoleSink) -> Self {
        Self {
            line: Vec::new(),
            sink,
        }
    }

    /// Takes one byte written by the guest.
    pub fn put(&mut self, byte: u8) {
        self.line.push(byte);
        if byte == b'\n' || self.line.len() >= MAX_LINE_BYTES {
            self.flush();
        }
    }

    /// Writes out a partial line (the vCPU stopped mid-line).
    pub fn flush(&mut self) {
        if self.line.is_empty() {
            return;
        }
        if self.line.last() != Some(&b'\n') {
            self.line.push(b'\n');
        }
        let mut sink = self.sink.lock().unwrap_or_else(|e| e.into_inner());
        // A closed stdout must not kill the guest; the payload keeps running.
        let _ = sink.write_all(&self.line);
        let _ = sink.flush();
        self.line.clear();
    }
}

impl Drop for VcpuConsole {
    fn drop(&mut self) {
        self.flush();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Default)]
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_from_two_vcpus_do_not_interleave() {
        let out = Shared::default();
        let sink: ConsoleSink = Arc::new(Mutex::new(Box::new(out.clone())));
        let mut a = VcpuConsole::new(sink.clone());
        let mut b = VcpuConsole::new(sink);
        for (x, y) in "aaaa\n".bytes().zip("bbbb\n".bytes()) {
            a.put(x);
            b.put(y);
        }
        b.put(b'c');
        drop(b);
        assert_eq!(
            String::from_utf8(out.0.lock().unwrap().clone()).unwrap(),
            "aaaa\nbbbb\nc\n"
        );
    }
}
