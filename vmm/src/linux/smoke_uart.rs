//! Just enough of an 8250 UART at 0x3f8 for the kernel's early console
//! (`earlyprintk=serial`): it programs the divisor, then polls LSR for an
//! empty transmitter before each byte it writes to THR. The real device
//! model lives in the `devices` crate; this stand-in keeps the smoke boot
//! independent of it.

/// The first COM port.
pub const COM1_BASE: u16 = 0x3f8;
/// Registers per UART.
pub const REGISTER_COUNT: u16 = 8;

const THR: u16 = 0;
const IIR: u16 = 2;
const LCR: u16 = 3;
const LSR: u16 = 5;
/// LCR bit 7: registers 0 and 1 are the divisor latch, not data.
const LCR_DLAB: u8 = 0x80;
/// LSR: transmit holding register and transmitter empty.
const LSR_THR_EMPTY: u8 = 0x60;
/// IIR: no interrupt pending.
const IIR_NONE_PENDING: u8 = 0x01;

/// The UART's state: only the line control register matters.
#[derive(Debug, Default)]
pub struct SmokeUart {
    lcr: u8,
}

impl SmokeUart {
    /// A guest write of `value` to register `offset`; returns the byte
    /// transmitted, if it was one.
    pub fn write(&mut self, offset: u16, value: u8) -> Option<u8> {
        match offset {
            THR if self.lcr & LCR_DLAB == 0 => Some(value),
            LCR => {
                self.lcr = value;
                None
            }
            _ => None,
        }
    }

    /// A guest read of register `offset`.
    pub fn read(&self, offset: u16) -> u8 {
        match offset {
            LSR => LSR_THR_EMPTY,
            IIR => IIR_NONE_PENDING,
            LCR => self.lcr,
            _ => 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisor_writes_are_not_output() {
        let mut uart = SmokeUart::default();
        assert_eq!(uart.write(LCR, 0x83), None);
        assert_eq!(uart.write(THR, 0x01), None, "divisor latch low");
        assert_eq!(uart.write(LCR, 0x03), None);
        assert_eq!(uart.write(THR, b'L'), Some(b'L'));
        assert_eq!(uart.read(LSR) & 0x20, 0x20);
        assert_eq!(uart.read(LCR), 0x03);
        assert_eq!(uart.read(7), 0);
    }
}
