//! The libFuzzer driver of every target: `HUGEVMM_FUZZ_TARGET` names the
//! one to run (`tools/fuzz` sets it), the arguments are libFuzzer's.
#![no_main]

use std::sync::OnceLock;

use hugevmm_fuzz::{target, Target, TARGETS};

fn chosen() -> &'static Target {
    static CHOSEN: OnceLock<&'static Target> = OnceLock::new();
    CHOSEN.get_or_init(|| {
        let name = std::env::var("HUGEVMM_FUZZ_TARGET").unwrap_or_default();
        target(&name).unwrap_or_else(|| {
            let names: Vec<_> = TARGETS.iter().map(|t| t.name).collect();
            eprintln!(
                "hugevmm-fuzz: set HUGEVMM_FUZZ_TARGET to one of {}",
                names.join(", ")
            );
            std::process::exit(2)
        })
    })
}

libfuzzer_sys::fuzz_target!(|data: &[u8]| {
    (chosen().run)(data);
});
