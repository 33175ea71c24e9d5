//! Progress output: one line per step on stderr, stamped with the time
//! since the bench started, so a long full run shows where it is. stdout
//! is left to the final tables.

use std::io::Write;
use std::time::Instant;

/// The progress printer.
pub struct Progress {
    started: Instant,
    suite: String,
    step: usize,
    steps: usize,
}

impl Progress {
    /// Starts the clock.
    pub fn new() -> Progress {
        Progress {
            started: Instant::now(),
            suite: String::new(),
            step: 0,
            steps: 0,
        }
    }

    fn stamp(&self) -> String {
        format!("[{:6.1}s]", self.started.elapsed().as_secs_f64())
    }

    /// A new suite begins.
    pub fn suite(&mut self, name: &str) {
        self.suite = name.to_string();
        self.step = 0;
        self.steps = 0;
        eprintln!("{} == {name} ==", self.stamp());
    }

    /// Name of the suite running now.
    pub fn current_suite(&self) -> String {
        self.suite.clone()
    }

    /// The suite announces how many steps it will take (for `k/N`).
    pub fn plan(&mut self, steps: usize) {
        self.steps = steps;
    }

    /// The suite found it needs another step (a run repeated with other
    /// settings): `N` of `k/N` grows by one.
    pub fn add_step(&mut self) {
        self.steps += 1;
    }

    /// Starts a step: prints its name without a newline, so that
    /// [`Progress::done`] completes the line with the step's key figure.
    pub fn start(&mut self, what: &str) {
        self.step += 1;
        let count = if self.steps > 0 {
            format!("{}/{}", self.step, self.steps)
        } else {
            format!("{}", self.step)
        };
        eprint!("{} {} {count:>5}  {what} ... ", self.stamp(), self.suite);
        let _ = std::io::stderr().flush();
    }

    /// Ends the current step's line with its key figure.
    pub fn done(&mut self, figure: &str) {
        eprintln!("{figure}");
    }

    /// Ends the current step's line with a failure.
    pub fn failed(&mut self, why: &str) {
        eprintln!("FAILED: {why}");
    }

    /// A line of its own (notes, skips).
    pub fn note(&mut self, text: &str) {
        eprintln!("{} {text}", self.stamp());
    }
}
