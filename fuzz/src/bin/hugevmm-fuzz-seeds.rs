//! Writes the seed corpus: `hugevmm-fuzz-seeds DIR` puts each target's
//! seeds in `DIR/TARGET/` (tools/fuzz reads them from fuzz/corpus).

use hugevmm_fuzz::seeds::seeds;
use hugevmm_fuzz::TARGETS;

fn main() {
    let dir = std::env::args_os().nth(1).unwrap_or_else(|| {
        eprintln!("usage: hugevmm-fuzz-seeds DIR");
        std::process::exit(2)
    });
    let dir = std::path::PathBuf::from(dir);
    for target in TARGETS {
        let sub = dir.join(target.name);
        std::fs::create_dir_all(&sub).expect("create the corpus directory");
        for (name, bytes) in seeds(target.name) {
            std::fs::write(sub.join(format!("seed-{name}")), bytes).expect("write a seed");
        }
    }
}
