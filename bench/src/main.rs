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

fn main() {
    let cli = Cli::parse();
    let status = bench::run(cli.args).unwrap_or_else(|e| {
        eprintln!("hugevmm: error: {}", error_text::one_line(&e));
        1
    });
    std::process::exit(status);
}
