//! Dependencies between the engine's modules, and between the VMM's,
//! point one way (docs/ARCHITECTURE.md, "No import circles"):
//! `tools/module-cycles` finds none. A circle crept back once between two
//! sessions that never ran the tool; this keeps it from doing so again.

use std::path::Path;
use std::process::Command;

fn no_circle_in(dir: &str) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let output = Command::new("python3")
        .arg(root.join("tools/module-cycles"))
        .arg("--recursive")
        .arg(root.join(dir))
        .output()
        .expect("running tools/module-cycles (python3 is needed)");
    let report = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "import circles in {dir}; break them (docs/ARCHITECTURE.md says how earlier ones were):\n{report}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        report.contains("no circle"),
        "tools/module-cycles printed no verdict for {dir}:\n{report}"
    );
}

#[test]
fn the_engine_modules_have_no_import_circle() {
    no_circle_in("swap/src/engine");
}

#[test]
fn the_vmm_modules_have_no_import_circle() {
    no_circle_in("vmm/src");
}
