//! The host terminal hugevmm runs in, as the console input of a Linux
//! guest.
//!
//! The terminal goes into raw mode (keys reach the guest as typed: Ctrl-C
//! interrupts the guest's program, not hugevmm), and a thread moves what is
//! typed into the UART's receive FIFO. Ctrl-A x ends the VM, as in QEMU.
//! The terminal is restored when the returned [`HostTerminal`] is dropped
//! (the end of the run, also on its error paths and on unwinding) and, as a
//! last resort, at process exit.

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex, Once};
use std::thread::JoinHandle;
use std::time::Duration;

use devices::SerialPort;

use crate::event::RunEvent;

/// The escape key: Ctrl-A.
pub const ESCAPE: u8 = 0x01;
/// Bytes typed but not yet taken by the guest, kept at most: beyond this a
/// guest that does not read its console loses further typing rather than
/// growing the VMM's memory.
const PENDING_MAX_BYTES: usize = 4096;
/// How long the input thread waits for a key before it checks whether the
/// run ended; bounds how long dropping [`HostTerminal`] takes.
const IDLE_POLL: Duration = Duration::from_millis(100);
/// How soon it retries while the guest's FIFO is full.
const FULL_FIFO_RETRY: Duration = Duration::from_millis(10);

const HELP: &str = concat!(
    "\nhugevmm console keys:\n",
    "  Ctrl-A x       quit (ends the VM, exit status 0)\n",
    "  Ctrl-A Ctrl-A  send Ctrl-A to the guest\n",
    "  Ctrl-A h       this help\n",
);

/// Why the terminal could not become the console input.
#[derive(Debug, thiserror::Error)]
pub enum HostTerminalError {
    /// The terminal settings could not be read or changed.
    #[error("cannot put the terminal in raw mode ({step}): {error}")]
    Termios {
        /// Which call failed.
        step: &'static str,
        /// The OS error.
        error: io::Error,
    },
    /// The input thread could not be started.
    #[error("cannot start the console input thread: {0}")]
    Thread(io::Error),
}

/// What a keystroke sequence asks hugevmm (not the guest) to do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConsoleCommand {
    /// Ctrl-A x: end the VM.
    Quit,
    /// Ctrl-A h: print the keys.
    Help,
}

/// Separates the escape sequences from what goes to the guest. The state
/// (an escape typed, its command key not yet) survives between reads,
/// since a terminal may deliver the two keys in separate reads.
#[derive(Debug, Default)]
pub struct EscapeFilter {
    after_escape: bool,
}

impl EscapeFilter {
    /// Appends the bytes meant for the guest to `guest` and returns the
    /// commands found, in order. After [`ConsoleCommand::Quit`] the rest of
    /// the input is dropped: the VM is ending.
    pub fn feed(&mut self, input: &[u8], guest: &mut Vec<u8>) -> Vec<ConsoleCommand> {
        let mut commands = Vec::new();
        for &byte in input {
            if !self.after_escape {
                if byte == ESCAPE {
                    self.after_escape = true;
                } else {
                    guest.push(byte);
                }
                continue;
            }
            self.after_escape = false;
            match byte {
                b'x' | b'X' => {
                    commands.push(ConsoleCommand::Quit);
                    return commands;
                }
                b'h' | b'H' => commands.push(ConsoleCommand::Help),
                ESCAPE => guest.push(ESCAPE),
                // Not a command: both keys go to the guest, so nothing
                // typed is silently lost.
                other => guest.extend_from_slice(&[ESCAPE, other]),
            }
        }
        commands
    }
}

/// The terminal settings before raw mode, for the restore at process exit
/// (`None` once restored).
static SAVED_TERMIOS: Mutex<Option<libc::termios>> = Mutex::new(None);
static ATEXIT: Once = Once::new();

fn restore_terminal() {
    // try_lock: at process exit another thread may have died holding the
    // lock; restoring is best effort there, never a hang.
    let saved = match SAVED_TERMIOS.try_lock() {
        Ok(mut guard) => guard.take(),
        Err(std::sync::TryLockError::Poisoned(e)) => e.into_inner().take(),
        Err(std::sync::TryLockError::WouldBlock) => None,
    };
    if let Some(termios) = saved {
        // SAFETY: fd 0 is a terminal (checked before raw mode was entered)
        // and `termios` is a valid settings struct tcgetattr filled in.
        unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &termios) };
    }
}

extern "C" fn restore_terminal_at_exit() {
    restore_terminal();
}

/// Whether stdin is a terminal this process may take over: a terminal, and
/// this process in its foreground group (a background job changing the
/// terminal's mode would be stopped by SIGTTOU).
pub fn stdin_is_foreground_terminal() -> bool {
    // SAFETY: isatty, tcgetpgrp and getpgrp only inspect fd 0 and the
    // process; no memory is passed.
    unsafe {
        libc::isatty(libc::STDIN_FILENO) == 1
            && libc::tcgetpgrp(libc::STDIN_FILENO) == libc::getpgrp()
    }
}

/// Puts fd 0 in raw input mode and remembers how to undo it.
fn enter_raw_mode() -> Result<(), HostTerminalError> {
    // SAFETY: termios is plain integers and arrays; all zeros is a valid
    // value for tcgetattr to overwrite.
    let mut termios: libc::termios = unsafe { std::mem::zeroed() };
    // SAFETY: `termios` is a valid, writable termios struct.
    if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut termios) } != 0 {
        return Err(HostTerminalError::Termios {
            step: "tcgetattr",
            error: io::Error::last_os_error(),
        });
    }
    let original = termios;
    // Raw input: no line editing, echo or signal keys (the guest's shell
    // does those), no CR/LF translation, 8-bit bytes. Output processing
    // stays on: the guest sends CRLF itself, and hugevmm's own messages
    // rely on the terminal turning LF into CRLF.
    termios.c_iflag &= !(libc::IGNBRK
        | libc::BRKINT
        | libc::PARMRK
        | libc::ISTRIP
        | libc::INLCR
        | libc::IGNCR
        | libc::ICRNL
        | libc::IXON);
    termios.c_lflag &= !(libc::ECHO | libc::ECHONL | libc::ICANON | libc::ISIG | libc::IEXTEN);
    termios.c_cflag = (termios.c_cflag & !(libc::CSIZE | libc::PARENB)) | libc::CS8;
    termios.c_cc[libc::VMIN] = 1;
    termios.c_cc[libc::VTIME] = 0;
    *SAVED_TERMIOS.lock().unwrap_or_else(|e| e.into_inner()) = Some(original);
    ATEXIT.call_once(|| {
        // SAFETY: the handler is a plain extern "C" fn that lives for the
        // whole process. A failed registration only loses the last-resort
        // restore; the guard still restores.
        unsafe { libc::atexit(restore_terminal_at_exit) };
    });
    // SAFETY: fd 0 is a terminal and `termios` a valid settings struct.
    let rc = unsafe { libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, &termios) };
    if rc != 0 {
        let error = io::Error::last_os_error();
        SAVED_TERMIOS
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        return Err(HostTerminalError::Termios {
            step: "tcsetattr",
            error,
        });
    }
    Ok(())
}

/// The terminal in raw mode and the thread feeding it to the guest;
/// dropping it stops the thread and restores the terminal.
pub struct HostTerminal {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Drop for HostTerminal {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            // The thread checks `stop` at least every IDLE_POLL.
            let _ = thread.join();
        }
        restore_terminal();
    }
}

/// Starts feeding the host terminal to `serial` if stdin is a terminal in
/// the foreground (None otherwise: input from a pipe or file is not read,
/// and a scripted run's stdin is left to the script). Ctrl-A x sends
/// `Quit` on `events`, which ends the run with status 0.
pub fn start(
    serial: Arc<Mutex<SerialPort>>,
    events: Sender<RunEvent>,
) -> Result<Option<HostTerminal>, HostTerminalError> {
    if !stdin_is_foreground_terminal() {
        return Ok(None);
    }
    enter_raw_mode()?;
    let stop = Arc::new(AtomicBool::new(false));
    let thread = {
        let stop = stop.clone();
        std::thread::Builder::new()
            .name("console-input".into())
            .spawn(move || {
                crate::seccomp::install_or_exit(crate::seccomp::ThreadKind::Device);
                input_loop(&serial, &events, &stop)
            })
    };
    let thread = match thread {
        Ok(thread) => thread,
        Err(error) => {
            restore_terminal();
            return Err(HostTerminalError::Thread(error));
        }
    };
    eprintln!("hugevmm: console input from this terminal; Ctrl-A x quits, Ctrl-A h lists the keys");
    Ok(Some(HostTerminal {
        stop,
        thread: Some(thread),
    }))
}

/// Waits up to `timeout` for fd 0 to be readable.
fn wait_readable(timeout: Duration) -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1.
    let rc = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    rc > 0 && fd.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0
}

fn input_loop(serial: &Mutex<SerialPort>, events: &Sender<RunEvent>, stop: &AtomicBool) {
    let mut filter = EscapeFilter::default();
    let mut pending: Vec<u8> = Vec::new();
    let mut stdin_open = true;
    while !stop.load(Ordering::SeqCst) {
        // Keep reading while the guest's FIFO is full, so Ctrl-A x works
        // even when the guest never reads its console.
        let timeout = if pending.is_empty() {
            IDLE_POLL
        } else {
            FULL_FIFO_RETRY
        };
        if stdin_open && wait_readable(timeout) {
            let mut buf = [0u8; 256];
            // SAFETY: `buf` is valid for writes of its length.
            let n = unsafe { libc::read(libc::STDIN_FILENO, buf.as_mut_ptr().cast(), buf.len()) };
            match n {
                0 => stdin_open = false,
                n if n < 0 => {
                    let error = io::Error::last_os_error();
                    if !matches!(
                        error.kind(),
                        io::ErrorKind::Interrupted | io::ErrorKind::WouldBlock
                    ) {
                        stdin_open = false;
                    }
                }
                n => {
                    let mut typed = Vec::new();
                    for command in filter.feed(&buf[..n as usize], &mut typed) {
                        match command {
                            ConsoleCommand::Quit => {
                                let _ = events.send(RunEvent::Quit {
                                    how: "console quit (Ctrl-A x)",
                                });
                                return;
                            }
                            ConsoleCommand::Help => eprint!("{HELP}"),
                        }
                    }
                    let room = PENDING_MAX_BYTES.saturating_sub(pending.len());
                    pending.extend_from_slice(&typed[..typed.len().min(room)]);
                }
            }
        } else if !stdin_open {
            std::thread::sleep(timeout);
        }
        if !pending.is_empty() {
            let taken = serial
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .enqueue_raw_bytes(&pending);
            pending.drain(..taken);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(filter: &mut EscapeFilter, input: &[u8]) -> (Vec<u8>, Vec<ConsoleCommand>) {
        let mut guest = Vec::new();
        let commands = filter.feed(input, &mut guest);
        (guest, commands)
    }

    #[test]
    fn plain_bytes_pass_through() {
        let mut f = EscapeFilter::default();
        assert_eq!(
            run(&mut f, b"ls -l\r\x03"),
            (b"ls -l\r\x03".to_vec(), vec![])
        );
    }

    #[test]
    fn ctrl_a_x_quits_and_drops_the_rest() {
        let mut f = EscapeFilter::default();
        assert_eq!(
            run(&mut f, b"ab\x01xcd"),
            (b"ab".to_vec(), vec![ConsoleCommand::Quit])
        );
        let mut f = EscapeFilter::default();
        assert_eq!(run(&mut f, b"\x01X"), (vec![], vec![ConsoleCommand::Quit]));
    }

    #[test]
    fn escape_split_across_reads_still_quits() {
        let mut f = EscapeFilter::default();
        assert_eq!(run(&mut f, b"a\x01"), (b"a".to_vec(), vec![]));
        assert_eq!(run(&mut f, b"x"), (vec![], vec![ConsoleCommand::Quit]));
    }

    #[test]
    fn double_escape_sends_one_and_other_keys_pass_with_it() {
        let mut f = EscapeFilter::default();
        assert_eq!(run(&mut f, b"\x01\x01"), (vec![ESCAPE], vec![]));
        assert_eq!(run(&mut f, b"\x01q"), (vec![ESCAPE, b'q'], vec![]));
        assert_eq!(
            run(&mut f, b"\x01h!"),
            (b"!".to_vec(), vec![ConsoleCommand::Help])
        );
        // After a complete sequence the filter is back to plain bytes.
        assert_eq!(run(&mut f, b"x"), (b"x".to_vec(), vec![]));
    }
}
