//! The devices of one VM: serial, i8042 and the ACPI sleep registers on the
//! port bus (Linux guests),
//! virtio-mmio disks and balloon on the MMIO bus (both kinds of guest).

use crate::balloon_handle::BalloonHandle;
use crate::event::RunEvent;
use crate::outputs::ConsoleLog;
use anyhow::{Context, Result};
use devices::virtio::{
    kernel_cmdline_fragment, Balloon, Block, DiskSpec, MmioTransport, MMIO_WINDOW_BYTES,
};
use devices::{
    CountingLine, EventFdLine, FreeMemorySink, GuestMemoryHandle, InterruptLine, MmioBus, PioBus,
    SerialPort, SleepControl, I8042,
};
use guestmem::GuestRam;
use kvm_ioctls::VmFd;
use std::io::Write;
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, OnceLock};
use swap::engine::SwapEngine;
use vm_memory::{Address, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

/// First virtio-mmio window, inside the `[3 GiB, 4 GiB)` hole.
pub const VIRTIO_MMIO_BASE: u64 = 0xd000_0000;
/// Interrupt line of the first virtio device; the next ones follow.
pub const VIRTIO_FIRST_IRQ: u32 = 5;
const SERIAL_PORT: u64 = 0x3f8;
const SERIAL_IRQ: u32 = 4;
const I8042_PORT: u64 = 0x60;

/// What devices to give the guest.
#[derive(Debug, Clone, Default)]
pub struct DeviceOptions {
    /// `--disk` images, in order.
    pub disks: Vec<DiskSpec>,
    /// `--balloon`.
    pub balloon: bool,
    /// `--balloon-target`, in 4 KiB pages (0: none).
    pub balloon_target_pages: u32,
    /// `--console-log`: serial output to this file (opened at the start,
    /// capped) instead of stdout.
    pub console_log: Option<ConsoleLog>,
}

/// One virtio-mmio device as the guest sees it.
#[derive(Debug, Clone, Copy)]
pub struct MmioWindow {
    /// Guest-physical base.
    pub base: u64,
    /// Window size.
    pub size_bytes: u64,
    /// Interrupt line.
    pub irq: u32,
}

/// The assembled buses.
pub struct MachineDevices {
    /// Port I/O devices (empty for payloads, which use the protocol ports).
    pub pio: Arc<PioBus>,
    /// MMIO devices.
    pub mmio: Arc<MmioBus>,
    /// The virtio windows, in command-line order.
    pub windows: Vec<MmioWindow>,
    /// The sink the balloon drops free chunks through; the swap engine is
    /// attached once it runs.
    pub free_memory: Arc<FreeChunkDropper>,
    /// The console UART (Linux guests), shared with the port bus so host
    /// terminal input can be queued into it.
    pub serial: Option<Arc<Mutex<SerialPort>>>,
    /// The balloon (`--balloon`), shared with the MMIO bus so the control
    /// socket can change its target while the guest runs.
    pub balloon: Option<BalloonHandle>,
}

impl MachineDevices {
    /// `virtio_mmio.device=` words for a Linux command line.
    pub fn kernel_cmdline(&self) -> String {
        self.windows
            .iter()
            .map(|w| kernel_cmdline_fragment(w.base, w.size_bytes, w.irq))
            .collect::<Vec<_>>()
            .join(" ")
    }
}

/// Where the devices raise interrupts.
pub enum Interrupts<'a> {
    /// Through KVM's in-kernel irqchip (irqfd); Linux guests.
    Irqchip(&'a VmFd),
    /// Nowhere: payloads run with interrupts off and poll.
    Polled,
}

fn line(interrupts: &Interrupts<'_>, irq: u32) -> Result<Arc<dyn InterruptLine>> {
    match interrupts {
        Interrupts::Polled => Ok(Arc::new(CountingLine::new())),
        Interrupts::Irqchip(vm) => {
            let event =
                EventFd::new(libc::EFD_NONBLOCK).context("cannot create an interrupt eventfd")?;
            vm.register_irqfd(&event, irq)
                .with_context(|| format!("cannot route interrupt {irq} through KVM (irqfd)"))?;
            Ok(Arc::new(EventFdLine::new(event)))
        }
    }
}

/// Builds every device. `serial` adds the 8250 UART, the i8042 and the
/// ACPI sleep registers (Linux guests); `events` receives the guest's
/// reset and power-off requests.
pub fn build(
    ram: &Arc<GuestRam>,
    options: &DeviceOptions,
    interrupts: Interrupts<'_>,
    serial: bool,
    events: &Sender<RunEvent>,
) -> Result<MachineDevices> {
    let mut pio = PioBus::new();
    let mut mmio = MmioBus::new();
    let memory: GuestMemoryHandle = ram.clone();
    let mut console = None;
    if serial {
        let out: Box<dyn Write + Send> = match &options.console_log {
            Some(log) => log.writer()?,
            None => Box::new(std::io::stdout()),
        };
        let uart = Arc::new(Mutex::new(SerialPort::new(
            line(&interrupts, SERIAL_IRQ)?,
            out,
        )));
        pio.insert(SERIAL_PORT, 8, uart.clone())?;
        console = Some(uart);
        let reset_events = Mutex::new(events.clone());
        let i8042 = I8042::new(Box::new(move || {
            let _ = reset_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(RunEvent::GuestReset { how: "i8042 reset" });
        }));
        pio.insert(I8042_PORT, 5, Arc::new(Mutex::new(i8042)))?;
        // The ACPI sleep registers the FADT names: `poweroff` in the guest.
        let power_off_events = Mutex::new(events.clone());
        let sleep_control = SleepControl::new(Box::new(move || {
            let _ = power_off_events
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .send(RunEvent::GuestReset {
                    how: "ACPI power off (S5)",
                });
        }));
        pio.insert(
            devices::sleep_control::SLEEP_CONTROL_PORT,
            devices::sleep_control::SLEEP_PORT_COUNT,
            Arc::new(Mutex::new(sleep_control)),
        )?;
        // Hardware Linux probes for and this machine lacks: answered as
        // absent, and kept out of the unknown-port log.
        for (port, count, _why) in devices::absent::LINUX_PROBED_PORTS {
            pio.insert(port, count, Arc::new(Mutex::new(devices::AbsentPorts)))?;
        }
    }
    let mut windows = Vec::new();
    let next_window = |windows: &mut Vec<MmioWindow>| {
        let index = windows.len() as u64;
        let window = MmioWindow {
            base: VIRTIO_MMIO_BASE + index * MMIO_WINDOW_BYTES,
            size_bytes: MMIO_WINDOW_BYTES,
            irq: VIRTIO_FIRST_IRQ + index as u32,
        };
        windows.push(window);
        window
    };
    for spec in &options.disks {
        let block = Block::open(spec)
            .with_context(|| format!("cannot open --disk {}", spec.path.display()))?;
        let w = next_window(&mut windows);
        let transport = MmioTransport::new(block, memory.clone(), line(&interrupts, w.irq)?);
        mmio.insert(w.base, w.size_bytes, Arc::new(Mutex::new(transport)))?;
    }
    let free_memory = Arc::new(FreeChunkDropper {
        ram: ram.clone(),
        engine: OnceLock::new(),
        // A payload's first chunk is the VMM region (page tables, stacks,
        // boot info): a guest that "frees" it would have it zeroed under
        // its own feet. Linux owns all of its RAM.
        keep_below: if serial { 0 } else { guestmem::CHUNK_BYTES },
    });
    let mut balloon_handle = None;
    if options.balloon {
        let mut balloon = Balloon::new(free_memory.clone());
        // No driver yet, so no interrupt to raise: the driver reads the
        // target when it starts.
        balloon
            .set_target_pages(options.balloon_target_pages)
            .context("cannot set the balloon target")?;
        let w = next_window(&mut windows);
        let transport = Arc::new(Mutex::new(MmioTransport::new(
            balloon,
            memory.clone(),
            line(&interrupts, w.irq)?,
        )));
        mmio.insert(w.base, w.size_bytes, transport.clone())?;
        balloon_handle = Some(BalloonHandle::new(transport));
    }
    Ok(MachineDevices {
        pio: Arc::new(pio),
        mmio: Arc::new(mmio),
        windows,
        free_memory,
        serial: console,
        balloon: balloon_handle,
    })
}

/// Drops whole free 2 MiB chunks the balloon reports: through the swap
/// engine when it runs (the chunk becomes Absent and its store slot is
/// freed), otherwise straight from the host mapping. Either way the guest
/// reads zeros there next, and no huge mapping is split.
pub struct FreeChunkDropper {
    ram: Arc<GuestRam>,
    engine: OnceLock<Arc<SwapEngine>>,
    /// Guest-physical bytes from 0 that are never dropped.
    keep_below: u64,
}

impl FreeChunkDropper {
    /// Routes drops through the swap engine from now on.
    pub fn attach_engine(&self, engine: Arc<SwapEngine>) {
        let _ = self.engine.set(engine);
    }

    fn drop_range(&self, gpa: GuestAddress, len_bytes: u64) -> Result<(), String> {
        let layout = self.ram.layout();
        let offset = layout
            .gpa_to_offset(gpa)
            .filter(|_| layout.contains(gpa, len_bytes));
        let gpa = gpa.raw_value();
        let offset =
            offset.ok_or_else(|| format!("free range {gpa:#x}+{len_bytes:#x} is not guest RAM"))?;
        if gpa < self.keep_below {
            return Err(format!(
                "free range {gpa:#x}+{len_bytes:#x} is in the VMM region below {:#x}; kept",
                self.keep_below
            ));
        }
        if let Some(engine) = self.engine.get() {
            return engine
                .discard_range(offset, len_bytes)
                .map(|_| ())
                .map_err(|e| e.to_string());
        }
        self.ram
            .discard(offset, len_bytes)
            .map_err(|e| e.to_string())
    }
}

impl FreeMemorySink for FreeChunkDropper {
    fn free_range(&self, gpa: GuestAddress, len_bytes: u64) {
        // The guest reports free memory as often as it likes.
        if let Err(e) = self.drop_range(gpa, len_bytes) {
            if crate::ratelimit::global().allow("balloon") {
                eprintln!("hugevmm: balloon: cannot drop free memory: {e}");
            }
        }
    }

    fn reclaim_range(&self, _gpa: GuestAddress, _len_bytes: u64) {
        // Nothing to do: dropped memory is refilled by the next touch.
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::outputs::OutputFile;
    use guestmem::{Backing, Layout};

    #[test]
    fn the_serial_console_log_stops_at_its_cap() {
        let path = std::env::temp_dir().join(format!("hugevmm-console-cap-{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        let out = OutputFile::open("--console-log", &path).unwrap();
        let ram =
            Arc::new(GuestRam::new(Layout::new(64 << 20).unwrap(), Backing::Small4k).unwrap());
        let options = DeviceOptions {
            console_log: Some(out.console_log(Some(64)).unwrap()),
            ..DeviceOptions::default()
        };
        let (events, _events_rx) = std::sync::mpsc::channel();
        let machine = build(&ram, &options, Interrupts::Polled, true, &events).unwrap();
        // A guest that prints for ever, as it does: a byte per port write.
        for i in 0..10_000u32 {
            machine.pio.write(SERIAL_PORT, &[b'a' + (i % 26) as u8]);
        }
        drop(machine);
        out.keep();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        assert!(text.len() < 300, "{} bytes: {text}", text.len());
        assert!(text.starts_with("abcdefghij"), "{text}");
        assert!(
            text.ends_with("reached --console-log-max (64 bytes); the rest of the guest's output is dropped]\n"),
            "{text}"
        );
    }
}
