//! `hugevmm bench`: benchmark suites that reproduce the seed measurements.

use anyhow::Result;

/// Arguments of `hugevmm bench`.
#[derive(clap::Args, Debug)]
pub struct BenchArgs {
    /// Suite to run.
    pub suite: String,
}

/// Runs a suite; returns the process exit status.
pub fn run(args: BenchArgs) -> Result<i32> {
    anyhow::bail!("bench suite {} is not implemented yet", args.suite)
}
