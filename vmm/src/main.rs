//! `hugevmm`: the command line of the `vmm` library.

fn main() {
    let logging = vmm::logger::init();
    std::process::exit(vmm::cli::main(logging));
}
