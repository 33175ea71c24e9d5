//! A self-contained Linux boot for testing the boot path end to end: one
//! vCPU, the early serial console captured, every other device absent.
//! The VMM's real exit loop (devices, several vCPUs) is elsewhere; this one
//! only has to show how far a kernel gets and why it stopped.

use std::fmt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use guestmem::{Backing, GuestRam, Layout};
use kvm_bindings::KVM_INTERNAL_ERROR_EMULATION;
use kvm_ioctls::{Kvm, VcpuExit, VcpuFd};
use vmm_sys_util::signal::{register_signal_handler, Killable, SIGRTMIN};

use super::smoke_uart::{SmokeUart, COM1_BASE, REGISTER_COUNT};
use super::{configure_vcpu, load, prepare_vm, BootSetup, LinuxBootConfig, MachineInfo};
use vm_memory::GuestAddress;

/// How a smoke boot ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SmokeEnd {
    /// KVM could not emulate an instruction: on hosts that emulate guest
    /// CPL 0 this is the expected end of an early boot.
    EmulationFailure {
        /// Guest rip (virtual).
        rip: u64,
        /// The instruction's first bytes, if rip could be translated.
        instruction: Option<Vec<u8>>,
    },
    /// Another KVM internal error.
    InternalError {
        /// KVM's suberror.
        suberror: u32,
        /// Guest rip.
        rip: u64,
    },
    /// A triple fault, or the guest reset the machine.
    Shutdown {
        /// Guest rip at the time.
        rip: u64,
    },
    /// The guest asked for a reset or power-off (KVM_EXIT_SYSTEM_EVENT).
    SystemEvent {
        /// The event type.
        kind: u32,
    },
    /// The time limit expired with the guest still running.
    Timeout,
    /// Anything else that stopped the vCPU.
    Other(String),
}

impl fmt::Display for SmokeEnd {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SmokeEnd::EmulationFailure {
                rip,
                instruction: Some(bytes),
            } => {
                write!(
                    f,
                    "emulation failure at rip {rip:#x} (instruction bytes {bytes:02x?})"
                )
            }
            SmokeEnd::EmulationFailure {
                rip,
                instruction: None,
            } => write!(f, "emulation failure at rip {rip:#x}"),
            SmokeEnd::InternalError { suberror, rip } => {
                write!(
                    f,
                    "KVM internal error, suberror {suberror}, at rip {rip:#x}"
                )
            }
            SmokeEnd::Shutdown { rip } => {
                write!(f, "shutdown (triple fault or reset) at rip {rip:#x}")
            }
            SmokeEnd::SystemEvent { kind } => write!(f, "system event {kind}"),
            SmokeEnd::Timeout => write!(f, "timeout"),
            SmokeEnd::Other(what) => write!(f, "{what}"),
        }
    }
}

/// One line of serial output and when it was complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SerialLine {
    /// Time since the vCPU started.
    pub at: Duration,
    /// The text, without the newline.
    pub text: String,
}

/// The result of a smoke boot.
#[derive(Debug)]
pub struct SmokeBoot {
    /// Everything the guest wrote to COM1.
    pub serial: String,
    /// The complete lines of `serial`, timed.
    pub lines: Vec<SerialLine>,
    /// Why the run ended.
    pub end: SmokeEnd,
    /// Time from the vCPU's start to the end.
    pub elapsed: Duration,
    /// Where the kernel was put.
    pub setup: BootSetup,
    /// The RAM layout the guest was given.
    pub layout: Layout,
}

#[derive(Default)]
struct SerialLog {
    lines: Vec<SerialLine>,
    partial: Vec<u8>,
}

impl SerialLog {
    fn push(&mut self, byte: u8, at: Duration) {
        match byte {
            b'\n' => {
                let text = String::from_utf8_lossy(&self.partial)
                    .trim_end_matches('\r')
                    .to_string();
                self.lines.push(SerialLine { at, text });
                self.partial.clear();
            }
            _ => self.partial.push(byte),
        }
    }

    fn text(&self) -> String {
        let mut text: String = self.lines.iter().map(|l| format!("{}\n", l.text)).collect();
        text.push_str(&String::from_utf8_lossy(&self.partial));
        text
    }
}

/// The signal that knocks the vCPU thread out of KVM_RUN at the deadline.
fn kick_signal() -> i32 {
    SIGRTMIN()
}

extern "C" fn ignore_signal(_: libc::c_int, _: *mut libc::siginfo_t, _: *mut libc::c_void) {}

fn install_kick_handler() -> Result<()> {
    static INSTALLED: OnceLock<Result<(), String>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            // The handler does nothing; its only effect is that KVM_RUN
            // returns EINTR, which needs a handler rather than SIG_IGN.
            register_signal_handler(kick_signal(), ignore_signal).map_err(|e| e.to_string())
        })
        .clone()
        .map_err(|e| anyhow::anyhow!("cannot install the vCPU kick signal handler: {e}"))
}

/// Boots `kernel` (a bzImage or vmlinux) on one vCPU with `mem_bytes` of
/// RAM and returns its serial output and why it stopped: an emulation
/// failure, a shutdown, or `timeout`.
pub fn smoke_boot(
    kernel: &Path,
    cmdline: &str,
    mem_bytes: u64,
    timeout: Duration,
) -> Result<SmokeBoot> {
    install_kick_handler()?;
    let kvm = Kvm::new().context("cannot open /dev/kvm")?;
    let layout = Layout::new(mem_bytes)?;
    let ram = Arc::new(GuestRam::new(layout.clone(), Backing::Thp)?);
    let vm = kvm.create_vm().context("KVM_CREATE_VM failed")?;
    prepare_vm(&vm)?;
    ram.register_memslots(&vm)?;
    let config = LinuxBootConfig {
        kernel: kernel.to_path_buf(),
        initrd: None,
        cmdline: cmdline.to_string(),
        virtio_announce: Default::default(),
    };
    let setup = load(
        &ram,
        &config,
        &MachineInfo {
            vcpus: 1,
            virtio: Vec::new(),
            virtio_in_dsdt: true,
        },
    )?;
    let vcpu = vm.create_vcpu(0).context("cannot create vCPU 0")?;
    configure_vcpu(&kvm, &vcpu, 0, &setup)?;

    let serial = Arc::new(Mutex::new(SerialLog::default()));
    let stop = Arc::new(AtomicBool::new(false));
    let (done_tx, done_rx) = mpsc::channel();
    let started = Instant::now();
    let thread = {
        let (ram, serial, stop) = (ram.clone(), serial.clone(), stop.clone());
        std::thread::Builder::new()
            .name("smoke-vcpu0".into())
            .spawn(move || {
                let end = run_vcpu(vcpu, &ram, &serial, &stop, started);
                let _ = done_tx.send(end);
            })?
    };
    let end = match done_rx.recv_timeout(timeout) {
        Ok(end) => end,
        Err(_) => {
            stop.store(true, Ordering::SeqCst);
            // The kick may land just before the thread enters KVM_RUN and be
            // lost, so repeat it until the thread has noticed `stop`.
            while !thread.is_finished() {
                thread
                    .kill(kick_signal())
                    .context("cannot signal the vCPU thread")?;
                std::thread::sleep(Duration::from_millis(5));
            }
            done_rx.recv().unwrap_or(SmokeEnd::Timeout)
        }
    };
    let elapsed = started.elapsed();
    thread
        .join()
        .map_err(|_| anyhow::anyhow!("the vCPU thread panicked"))?;
    let log = serial.lock().unwrap_or_else(|e| e.into_inner());
    Ok(SmokeBoot {
        serial: log.text(),
        lines: log.lines.clone(),
        end,
        elapsed,
        setup,
        layout,
    })
}

enum Step {
    Continue,
    Shutdown,
    InternalError,
    End(SmokeEnd),
}

fn run_vcpu(
    mut vcpu: VcpuFd,
    ram: &GuestRam,
    serial: &Mutex<SerialLog>,
    stop: &AtomicBool,
    started: Instant,
) -> SmokeEnd {
    let mut uart = SmokeUart::default();
    let com1 = COM1_BASE..COM1_BASE + REGISTER_COUNT;
    loop {
        if stop.load(Ordering::SeqCst) {
            return SmokeEnd::Timeout;
        }
        let step = match vcpu.run() {
            Ok(VcpuExit::IoOut(port, data)) => {
                if com1.contains(&port) {
                    if let Some(byte) = uart.write(port - COM1_BASE, data[0]) {
                        serial
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push(byte, started.elapsed());
                    }
                }
                Step::Continue
            }
            Ok(VcpuExit::IoIn(port, data)) => {
                data.fill(0xff);
                if com1.contains(&port) {
                    data[0] = uart.read(port - COM1_BASE);
                }
                Step::Continue
            }
            Ok(VcpuExit::MmioRead(_, data)) => {
                data.fill(0xff);
                Step::Continue
            }
            // With the in-kernel irqchip KVM handles HLT itself; an exit
            // here is spurious and the guest just continues.
            Ok(VcpuExit::MmioWrite(..)) | Ok(VcpuExit::Hlt) => Step::Continue,
            Ok(VcpuExit::Shutdown) => Step::Shutdown,
            Ok(VcpuExit::InternalError) => Step::InternalError,
            Ok(VcpuExit::SystemEvent(kind, _)) => Step::End(SmokeEnd::SystemEvent { kind }),
            Ok(other) => Step::End(SmokeEnd::Other(format!("unexpected KVM exit {other:?}"))),
            Err(e) if e.errno() == libc::EINTR || e.errno() == libc::EAGAIN => Step::Continue,
            Err(e) => Step::End(SmokeEnd::Other(format!("KVM_RUN failed: {e}"))),
        };
        match step {
            Step::Continue => {}
            Step::Shutdown => return SmokeEnd::Shutdown { rip: rip(&vcpu) },
            Step::InternalError => return describe_internal_error(&mut vcpu, ram),
            Step::End(end) => return end,
        }
    }
}

fn rip(vcpu: &VcpuFd) -> u64 {
    vcpu.get_regs().map(|r| r.rip).unwrap_or(0)
}

fn describe_internal_error(vcpu: &mut VcpuFd, ram: &GuestRam) -> SmokeEnd {
    // SAFETY: the exit was KVM_EXIT_INTERNAL_ERROR, so `internal` is the
    // union member KVM filled in.
    let suberror = unsafe { vcpu.get_kvm_run().__bindgen_anon_1.internal.suberror };
    let rip = rip(vcpu);
    if suberror != KVM_INTERNAL_ERROR_EMULATION {
        return SmokeEnd::InternalError { suberror, rip };
    }
    let instruction = vcpu
        .translate_gva(rip)
        .ok()
        .filter(|t| t.valid != 0)
        .and_then(|t| {
            let mut bytes = vec![0u8; 8];
            ram.read_bytes(GuestAddress(t.physical_address), &mut bytes)
                .ok()
                .map(|_| bytes)
        });
    SmokeEnd::EmulationFailure { rip, instruction }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::linux::e820::e820_map;

    const KERNEL: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../target/linux-kernel/vmlinuz"
    );
    const CMDLINE: &str = "earlyprintk=serial,ttyS0,115200 console=ttyS0 panic=-1";

    /// The text after the kernel's `[    0.000000] ` time stamp.
    fn message(line: &str) -> &str {
        match line
            .strip_prefix('[')
            .and_then(|rest| rest.split_once("] "))
        {
            Some((_, text)) => text,
            None => line,
        }
    }

    #[test]
    fn stock_kernel_prints_banner_cmdline_and_our_e820_map() {
        if !Path::new(KERNEL).exists() {
            test_resources::skip(
                "stock_kernel_prints_banner_cmdline_and_our_e820_map",
                test_resources::Resource::Kernel,
                format!("no kernel at {KERNEL}; run .ci/fetch-kernel"),
            );
            return;
        }
        if test_resources::skip_without_kvm("stock_kernel_prints_banner_cmdline_and_our_e820_map") {
            return;
        }
        // About 40 s alone on a host that emulates guest CPL 0 (most of it in
        // the kernel's byte-wise `rep stosb` memsets and table searches), but
        // 160 s was seen beside other builds on two cores.
        let timeout = Duration::from_secs(300);
        let boot = smoke_boot(Path::new(KERNEL), CMDLINE, 256 << 20, timeout).unwrap();
        for line in &boot.lines {
            println!("{:>8.3}s | {}", line.at.as_secs_f64(), line.text);
        }
        println!(
            "kernel: {:?}, entry {:#x}, occupying {:#x?}",
            boot.setup.kind, boot.setup.entry_gpa, boot.setup.kernel_gpa
        );
        println!(
            "ended after {:.2} s: {}",
            boot.elapsed.as_secs_f64(),
            boot.end
        );

        let messages: Vec<&str> = boot.lines.iter().map(|l| message(&l.text)).collect();
        let banner = messages.iter().find(|m| m.starts_with("Linux version "));
        assert!(banner.is_some(), "no banner in:\n{}", boot.serial);
        let cmdline = messages
            .iter()
            .find_map(|m| m.strip_prefix("Command line: "));
        assert_eq!(cmdline, Some(CMDLINE), "serial:\n{}", boot.serial);
        let e820: Vec<&str> = messages
            .iter()
            .copied()
            .filter(|m| m.starts_with("BIOS-e820:"))
            .collect();
        let expected: Vec<String> = e820_map(&boot.layout)
            .iter()
            .map(|e| e.kernel_log_line())
            .collect();
        assert_eq!(e820, expected, "serial:\n{}", boot.serial);
        assert_ne!(
            boot.end,
            SmokeEnd::Timeout,
            "the kernel neither stopped nor failed within {timeout:?}"
        );
    }
}
