//! The `--swap-store` value (`swap::store::StoreSpec`): parsing, printing
//! back (the docs promise the printed form parses to the same spec), the
//! size check against a run's needs, and opening the memory stores (which
//! touch no file).

use swap::store::{CapacityNeed, StoreSpec};

/// Runs one input: the text of the value (invalid UTF-8 is what the CLI
/// cannot pass, so it is skipped).
pub fn run(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let spec: StoreSpec = match text.parse() {
        Ok(spec) => spec,
        Err(err) => {
            let _ = err.to_string();
            return;
        }
    };
    let printed = spec.to_string();
    let again: StoreSpec = printed
        .parse()
        .unwrap_or_else(|e| panic!("{text:?} printed as {printed:?}, which does not parse: {e}"));
    assert_eq!(again, spec, "{text:?} printed as {printed:?}");
    let need = CapacityNeed {
        guest_ram_bytes: 64 << 20,
        mem_limit_bytes: Some(32 << 20),
        unit_bytes: 2 << 20,
        in_flight_units: 4,
    };
    let _ = spec.check_size(&need);
    if opens_no_file(&spec) {
        // A small guest's worth of slots in 4 KiB units: opening allocates
        // only the slot table.
        if let Ok(store) = spec.open(4096, 1 << 20) {
            assert_eq!(store.unit_bytes(), 4096);
            assert_eq!(store.used_slots(), 0);
        }
    }
}

fn opens_no_file(spec: &StoreSpec) -> bool {
    match spec {
        StoreSpec::Mem { .. } => true,
        StoreSpec::Faulty { inner, .. } => opens_no_file(inner),
        StoreSpec::Default
        | StoreSpec::DefaultReserved
        | StoreSpec::File { .. }
        | StoreSpec::Nbd { .. }
        | StoreSpec::VhostUserBlk { .. } => false,
    }
}
