//! The guest console: a 16550A-compatible UART (COM1) built on
//! `vm_superio::Serial`.
//!
//! Output bytes go to any writer (stdout, or the `--console-log` file);
//! input bytes are queued with [`SerialPort::enqueue_raw_bytes`] by whoever
//! reads the host terminal.

use std::io::{self, Write};
use std::sync::Arc;

use vm_superio::serial::{Error as UartError, NoEvents};
use vm_superio::{Serial, Trigger};

use crate::bus::PioDevice;
use crate::interrupt::InterruptLine;

/// COM1's first port.
pub const SERIAL_PORT_BASE: u64 = 0x3f8;
/// Ports the UART occupies from [`SERIAL_PORT_BASE`].
pub const SERIAL_PORT_COUNT: u64 = 8;
/// COM1's ISA interrupt line.
pub const SERIAL_IRQ: u32 = 4;

/// Adapts an [`InterruptLine`] to the trigger type `vm_superio` wants.
struct LineTrigger(Arc<dyn InterruptLine>);

impl Trigger for LineTrigger {
    type E = io::Error;

    fn trigger(&self) -> io::Result<()> {
        self.0.trigger()
    }
}

/// The UART as a port-I/O device at [`SERIAL_PORT_BASE`].
pub struct SerialPort {
    uart: Serial<LineTrigger, NoEvents, Box<dyn Write + Send>>,
    /// Output or interrupt failures so far; counted rather than reported
    /// per byte, because the guest cannot be told and a broken console log
    /// must not stop the VM.
    errors: u64,
}

impl std::fmt::Debug for SerialPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SerialPort")
            .field("errors", &self.errors)
            .finish_non_exhaustive()
    }
}

impl SerialPort {
    /// A UART whose output goes to `out` and whose interrupt is `irq`.
    ///
    /// `vm_superio` flushes `out` after every byte, so give it a writer
    /// whose flush is cheap (stdout, a file) rather than a buffered one that
    /// relies on flush being rare.
    pub fn new(irq: Arc<dyn InterruptLine>, out: Box<dyn Write + Send>) -> Self {
        Self {
            uart: Serial::new(LineTrigger(irq), out),
            errors: 0,
        }
    }

    /// Queues input bytes for the guest to read and raises the receive
    /// interrupt if the guest enabled it. Returns how many bytes fit in the
    /// 64-byte FIFO (0 when it is full: retry after the guest reads).
    pub fn enqueue_raw_bytes(&mut self, input: &[u8]) -> usize {
        let free_bytes = self.uart.fifo_capacity();
        match self.uart.enqueue_raw_bytes(input) {
            Ok(count) => count,
            Err(UartError::FullFifo) => 0,
            Err(_) => {
                // The bytes are in the FIFO; only the interrupt failed.
                self.errors += 1;
                free_bytes.min(input.len())
            }
        }
    }

    /// Free space in the receive FIFO, in bytes.
    pub fn fifo_capacity(&self) -> usize {
        self.uart.fifo_capacity()
    }

    /// Output or interrupt failures since creation.
    pub fn error_count(&self) -> u64 {
        self.errors
    }

    /// The output writer, e.g. to flush a log file at exit.
    pub fn writer_mut(&mut self) -> &mut (dyn Write + Send) {
        self.uart.writer_mut().as_mut()
    }
}

impl PioDevice for SerialPort {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        data.fill(0);
        let Some(first) = data.first_mut() else {
            return;
        };
        if let Ok(offset) = u8::try_from(offset) {
            *first = self.uart.read(offset);
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let (Ok(offset), Some(&value)) = (u8::try_from(offset), data.first()) else {
            return;
        };
        if self.uart.write(offset, value).is_err() {
            self.errors += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::interrupt::CountingLine;

    /// A writer the test can inspect after handing it to the UART.
    #[derive(Clone, Default)]
    struct SharedBuf(Arc<Mutex<Vec<u8>>>);

    impl Write for SharedBuf {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    const DATA: u64 = 0;
    const IER: u64 = 1;
    const IIR: u64 = 2;
    const LSR: u64 = 5;

    fn port() -> (SerialPort, Arc<CountingLine>, SharedBuf) {
        let line = Arc::new(CountingLine::new());
        let out = SharedBuf::default();
        let port = SerialPort::new(line.clone(), Box::new(out.clone()));
        (port, line, out)
    }

    fn inb(port: &mut SerialPort, offset: u64) -> u8 {
        let mut b = [0u8];
        port.read(offset, &mut b);
        b[0]
    }

    #[test]
    fn output_bytes_reach_the_writer() {
        let (mut port, line, out) = port();
        for &b in b"hi\n" {
            port.write(DATA, &[b]);
        }
        assert_eq!(&out.0.lock().unwrap()[..], b"hi\n");
        // No interrupt: the guest has not enabled any.
        assert_eq!(line.count(), 0);
        // Transmitter always empty.
        assert_ne!(inb(&mut port, LSR) & 0x20, 0);
    }

    #[test]
    fn transmit_interrupt_when_enabled() {
        let (mut port, line, _out) = port();
        port.write(IER, &[0x02]); // THR empty interrupt
        assert_eq!(line.count(), 1, "enabling with an empty THR raises it");
        assert_eq!(inb(&mut port, IIR) & 0x0f, 0x02);
        port.write(DATA, b"x");
        assert_eq!(line.count(), 2);
    }

    #[test]
    fn input_is_queued_and_raises_the_receive_interrupt() {
        let (mut port, line, _out) = port();
        port.write(IER, &[0x01]); // received data available
        assert_eq!(port.enqueue_raw_bytes(b"ok"), 2);
        assert_eq!(line.count(), 1);
        assert_ne!(inb(&mut port, LSR) & 0x01, 0, "data ready");
        assert_eq!(inb(&mut port, DATA), b'o');
        assert_eq!(inb(&mut port, DATA), b'k');
        assert_eq!(inb(&mut port, LSR) & 0x01, 0);
        let big = [b'z'; 100];
        assert_eq!(port.enqueue_raw_bytes(&big), 64);
        assert_eq!(port.fifo_capacity(), 0);
        assert_eq!(port.enqueue_raw_bytes(b"more"), 0);
        assert_eq!(port.error_count(), 0);
    }

    #[test]
    fn odd_accesses_are_harmless() {
        let (mut port, _line, out) = port();
        port.write(DATA, &[]);
        port.write(1 << 20, &[1]);
        let mut wide = [0xffu8; 4];
        port.read(LSR, &mut wide);
        assert_eq!(&wide[1..], &[0, 0, 0]);
        port.read(1 << 20, &mut wide);
        assert_eq!(wide, [0; 4]);
        assert!(out.0.lock().unwrap().is_empty());
    }
}
