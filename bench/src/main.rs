//! `hugevmm-bench`: the benchmark suites' command line. `hugevmm bench
//! ARGS` starts it with the same arguments (docs/BENCHMARKS.md).

use clap::Parser;

#[derive(Parser)]
#[command(
    name = "hugevmm-bench",
    version,
    about = "hugevmm's benchmark suites (also run as `hugevmm bench`)"
)]
struct Cli {
    #[command(flatten)]
    args: bench::BenchArgs,
}

/// An error and its causes on one line, each cause once: a cause whose
/// text the line holds already (thiserror's `{source}` in a message) is
/// left out.
fn error_text(e: &anyhow::Error) -> String {
    let mut text = String::new();
    for cause in e.chain() {
        let part = cause.to_string();
        if text.contains(&part) {
            continue;
        }
        if !text.is_empty() {
            text.push_str(": ");
        }
        text.push_str(&part);
    }
    text
}

fn main() {
    let cli = Cli::parse();
    let status = bench::run(cli.args).unwrap_or_else(|e| {
        eprintln!("hugevmm: error: {}", error_text(&e));
        1
    });
    std::process::exit(status);
}
